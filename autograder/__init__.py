"""Grading for Transformer Deep Dive: checks, nbgrader config and a sandboxed batch grader."""
