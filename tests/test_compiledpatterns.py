"""A session's regular expressions come compiled from the install, exactly as Python compiles them,
and only from a file nobody else could have written (portal/compiledpatterns.py). That a real
session's server and kernel use them: tests/test_spawn.py."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def fresh_python(code: str, *options: str, **env) -> str:
    """Run ``code`` in a new Python with the checkout's portal: use() changes the process's re."""
    done = subprocess.run([sys.executable, *options, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO), **env})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_every_listed_pattern_built_from_its_compiled_form_is_the_pattern_python_compiles(tmp_path):
    out = fresh_python(f"""
import re, json
from pathlib import Path
from portal import compiledpatterns as cp
listed = cp.listed_patterns()
written = cp.build(listed, Path({str(tmp_path / 'p.marshal')!r}))
assert cp.use(Path({str(tmp_path / 'p.marshal')!r})) == written
same = sum(cp._compile(p, f) == cp._real_compile(p, f) for p, f in listed)
# and they match as Python's own: every pattern against a few texts, groups and names included
texts = ["", "a", "Hello, World 42", "x=1; y = 'two'", "2026-11-27T10:45:00Z", "/user/a/api/kernels", "\\u00e9t\\u00e9"]
def answers(pattern):
    return [(m.span(), m.groups(), m.groupdict()) if m else None
            for m in (pattern.search(t if isinstance(pattern.pattern, str) else t.encode()) for t in texts)]
alike = sum(answers(cp._compile(p, f)) == answers(cp._real_compile(p, f)) for p, f in listed)
print(json.dumps({{"listed": len(listed), "written": written, "same": same, "alike": alike,
                   "used": re._compiler.compile is cp._compile}}))
""")
    seen = json.loads(out)
    assert seen["listed"] > 150 and seen["written"] == seen["listed"], seen
    assert seen["same"] == seen["alike"] == seen["listed"], seen
    assert seen["used"], seen


def test_a_file_anyone_else_could_have_written_or_another_pythons_or_a_broken_one_is_not_read(tmp_path):
    code = f"""
import re
from pathlib import Path
from portal import compiledpatterns as cp
path = Path({str(tmp_path / 'p.marshal')!r})
print(cp.use(path), re._compiler.compile is cp._real_compile, re.compile(r"(?P<a>x)+").groupindex["a"])
"""
    listed = [("(?P<a>x)+", 0), ("ab+c", 0)]
    fresh_python(f"from pathlib import Path; from portal import compiledpatterns as cp; "
                 f"cp.build({listed!r}, Path({str(tmp_path / 'p.marshal')!r}))")
    path = tmp_path / "p.marshal"
    assert fresh_python(code).split() == ["2", "False", "1"]  # root's, 644: read
    path.chmod(0o664)  # the group could have written it
    assert fresh_python(code).split() == ["0", "True", "1"]
    path.chmod(0o644)
    os.chown(path, pwd.getpwnam("nobody").pw_uid, -1)  # another account's
    assert fresh_python(code).split() == ["0", "True", "1"]
    os.chown(path, 0, -1)
    path.write_bytes(b"\xff not marshal")  # broken
    assert fresh_python(code).split() == ["0", "True", "1"]
    path.unlink()  # none for this Python (another build's name is never opened)
    assert fresh_python(code).split() == ["0", "True", "1"]
    # Written by a Python whose re compiled differently (an update that kept the version number).
    fresh_python(f"import marshal; from pathlib import Path; from portal import compiledpatterns as cp; "
                 f"path = Path({str(path)!r}); cp.build({listed!r}, path); written = marshal.loads(path.read_bytes()); "
                 f"written['compiler'][1][1] += 1; path.write_bytes(marshal.dumps(written))")
    assert fresh_python(code).split() == ["0", "True", "1"]
    assert fresh_python("from portal import compiledpatterns as cp; print(cp.cache_file('/x').name)").strip() \
        == f"compiled-patterns-{sys.implementation.cache_tag}-{sys.hexversion:x}-" \
           f"{__import__('_sre').MAGIC}-{__import__('_sre').CODESIZE}.marshal"


def test_a_str_and_a_bytes_pattern_of_the_same_text_each_get_their_own(tmp_path):
    """Their hashes are equal: they are told apart by kind, never compared (which -bb makes an error)."""
    out = fresh_python(f"""
from pathlib import Path
from portal import compiledpatterns as cp
path = Path({str(tmp_path / 'p.marshal')!r})
cp.build([("([*?[])", 0), (b"([*?[])", 0)], path)
print(cp.use(path))
import re
print(type(re.compile("([*?[])").pattern).__name__, type(re.compile(b"([*?[])").pattern).__name__,
      re.compile("([*?[])").match("?").group(1), re.compile(b"([*?[])").match(b"[").group(1).decode(), cp.counts["from the install"])
""", "-bb")
    assert out.split() == ["2", "str", "bytes", "?", "[", "2"], out


def test_the_list_holds_nothing_of_any_users_start():
    text = (REPO / "portal" / "compiled-patterns.json").read_text()
    for users_own in ("student", "alice", "bob", "mallory", "member", "/home/", "/user/", "/tmp/", "/var/", ".dsportal"):
        assert users_own not in text, users_own


def test_recording_keeps_only_what_two_users_starts_have_in_common(tmp_path):
    first, second = tmp_path / "alice.jsonl", tmp_path / "bob.jsonl"
    for file, user in ((first, "alice"), (second, "bob")):
        fresh_python(f"import re\nfrom portal import compiledpatterns as cp\ncp.use()\n"
                     f"re.compile(r'^/user/{user}/api$'); re.compile(r'[a-z]+\\d*', re.I); re.compile(b'x+y')",
                     DSPORTAL_RECORD_PATTERNS=str(file))
    listed = tmp_path / "list.json"
    fresh_python(f"from portal import compiledpatterns as cp; cp.main(['record', {str(listed)!r}, "
                 f"{str(first)!r}, {str(second)!r}])")
    assert json.loads(listed.read_text()) == [["[a-z]+\\d*", 2], [{"bytes": "x+y"}, 0]]
