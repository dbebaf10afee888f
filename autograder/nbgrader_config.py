"""nbgrader configuration of the course (nbgrader 0.9).

`python -m autograder release` loads this file and points ``CourseDirectory.root``
at a temporary course directory, so nothing but ``course/`` is written in the
repository. To use plain nbgrader commands (formgrader, the exchange, the
gradebook) copy this file into your own course directory and copy the chapters
of ``autograder/source/`` into its ``source/`` folder.
"""

from autograder import environment, limits

c = get_config()  # noqa: F821 (provided by traitlets when nbgrader loads this file)

# nbgrader runs `alembic` by name, which it looks for on PATH: put this Python's scripts first, so that
# `.venv/bin/nbgrader ...` works without activating the virtual environment; and a new gradebook is stamped
# with its schema's revision read in this process, not by running `alembic heads` (3.5 s of CPU each time).
environment.for_nbgrader()

c.CourseDirectory.course_id = "transformer-deep-dive"
c.CourseDirectory.source_directory = "source"
c.CourseDirectory.release_directory = "release"
c.CourseDirectory.submitted_directory = "submitted"
c.CourseDirectory.autograded_directory = "autograded"
c.CourseDirectory.feedback_directory = "feedback"

# The stub nbgrader puts in place of `### BEGIN SOLUTION` ... `### END SOLUTION`.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"
# Hidden tests (### BEGIN HIDDEN TESTS ... ### END HIDDEN TESTS) are removed from the
# release and put back by autograde; nbgrader's default delimiters are used.

# autograde runs each submission top to bottom; a cell gets at most 5 minutes (autograder/limits.py).
c.Execute.timeout = limits.NBGRADER_CELL_SECONDS
c.Execute.interrupt_on_timeout = True
c.Execute.allow_errors = True
# Waits for the kernel in slices of 1 s, so a lost zmq wake-up cannot hold a cell until its timeout
# (autograder/kernel_client.py).
c.Execute.kernel_manager_class = "autograder.kernel_client.SlicedKernelManager"
