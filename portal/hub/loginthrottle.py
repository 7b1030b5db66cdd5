"""Failed logins, remembered in the hub's memory: guessing a password gets slow, while a neighbour
who types wrong passwords for alice cannot keep her out for long.

Two limits:

- per account and client address: ``free_failures`` wrong passwords, then each further attempt
  waits ``first_delay`` seconds, doubling with each failure up to ``max_delay``; a success
  clears it. This is the guesser's limit (and, where people share an address, theirs too).
- per account, from any address: ``account_failures`` wrong passwords within ``account_window``
  seconds refuse the account for ``account_lock`` seconds, except from addresses it logged in
  from before (its owner's usual ones), so that the limit holds against a guesser who changes
  address, and still lets the account's owner in.

Refused attempts never reach LDAP and are not counted again.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field

from portal.core import defaults

MAX_TRACKED = 10_000  # accounts and (account, address) pairs kept; the stalest go first


@dataclass
class _Client:
    failures: int = 0
    refused_until: float = 0.0


@dataclass
class _Account:
    failures: deque = field(default_factory=deque)  # monotonic times of recent failures
    refused_until: float = 0.0
    known_addresses: set = field(default_factory=set)  # where it logged in before


class LoginThrottle:
    def __init__(self, free_failures: int = defaults.LOGIN_FREE_FAILURES, first_delay: float = defaults.LOGIN_FIRST_DELAY,
                 max_delay: float = defaults.LOGIN_MAX_DELAY, account_failures: int = defaults.LOGIN_ACCOUNT_FAILURES,
                 account_window: float = defaults.LOGIN_ACCOUNT_WINDOW, account_lock: float = defaults.LOGIN_ACCOUNT_LOCK,
                 clock=time.monotonic):
        self.free_failures, self.first_delay, self.max_delay = free_failures, first_delay, max_delay
        self.account_failures, self.account_window, self.account_lock = account_failures, account_window, account_lock
        self.clock = clock
        self._clients: dict[tuple[str, str], _Client] = {}
        self._accounts: dict[str, _Account] = {}

    def wait(self, account: str, address: str) -> int:
        """Whole seconds before this account may try again from this address; 0: now."""
        now = self.clock()
        until = self._clients.get((account, address), _Client()).refused_until
        record = self._accounts.get(account)
        if record and address not in record.known_addresses:
            until = max(until, record.refused_until)
        return max(0, math.ceil(until - now))

    def failed(self, account: str, address: str) -> None:
        now = self.clock()
        client = self._clients.setdefault((account, address), _Client())
        client.failures += 1
        beyond = client.failures - self.free_failures  # 0 after the last free failure: first_delay
        if beyond >= 0:
            client.refused_until = now + min(self.max_delay, self.first_delay * 2 ** min(beyond, 30))
        record = self._accounts.setdefault(account, _Account())
        record.failures.append(now)
        while record.failures and record.failures[0] < now - self.account_window:
            record.failures.popleft()
        if len(record.failures) >= self.account_failures:
            record.refused_until = now + self.account_lock
            record.failures.clear()  # the next lock takes as many failures again
        self._forget_stale(now)

    def succeeded(self, account: str, address: str) -> None:
        self._clients.pop((account, address), None)
        self._accounts.setdefault(account, _Account()).known_addresses.add(address)

    def _forget_stale(self, now: float) -> None:
        """Keep memory bounded: past MAX_TRACKED, drop what no longer refuses anything."""
        if len(self._clients) > MAX_TRACKED:
            for key in [k for k, c in self._clients.items() if c.refused_until < now][:len(self._clients) // 2]:
                del self._clients[key]
        if len(self._accounts) > MAX_TRACKED:
            stale = [name for name, a in self._accounts.items()
                     if a.refused_until < now and not a.known_addresses
                     and (not a.failures or a.failures[-1] < now - self.account_window)]
            for name in stale:
                del self._accounts[name]
