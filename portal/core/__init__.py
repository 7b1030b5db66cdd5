"""portal.yaml's model and what every side reads: settings, rules, the session's spec, templating."""
