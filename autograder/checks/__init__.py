"""Checks written once per chapter; see autograder.checks.core for the protocol."""
