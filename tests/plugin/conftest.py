"""user_suite/ is a user's test suite, run by test_pytest_plugin.py in its own pytest process
(the way a user runs it: the plugin loaded from its entry point), never collected here."""

collect_ignore = ["user_suite"]
