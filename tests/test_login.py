"""LDAP login: who gets in, who is refused, and what the login page tells them."""

import pytest

from conftest import PASSWORDS
from hubclient import HubUser

REFUSAL = "Invalid username or password"


def test_right_password_logs_in(portal):
    response = HubUser(portal, "alice").login(PASSWORDS["alice"])
    assert response.status_code == 302
    assert "/login" not in response.headers["location"]


@pytest.mark.parametrize(
    "name, password",
    [
        ("alice", "wrong-password"),
        ("nosuchuser", "whatever"),
        ("alice", ""),
        ("alice", "   "),
        ("mallory", PASSWORDS["mallory"]),  # a real LDAP account, outside the allowed group
        ("alice)(uid=*", "x"),  # LDAP filter injection
        ("*", "x"),
    ],
    ids=["wrong-password", "unknown-user", "empty-password", "blank-password", "outside-group", "injection", "wildcard"],
)
def test_refused_with_a_message_on_the_login_page(portal, name, password):
    user = HubUser(portal, name)
    response = user.login(password)
    assert response.status_code == 403
    assert REFUSAL in response.text
    # and no session was handed out
    assert user.web.get(f"{portal}/hub/api/user").status_code == 403
