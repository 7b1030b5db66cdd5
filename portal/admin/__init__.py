"""The admin's commands: check, the hub's account, the firewall, the database's move, usage."""
