"""Integrations with application frameworks, one subpackage each. A subpackage imports its
framework, so nothing else in skiplock imports this package: the framework loads it (Django's
TASKS setting names skiplock.contrib.django), or a flag asks for it (`skiplock worker --django`).
"""
