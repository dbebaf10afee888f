"""nbgrader for the servers of learners and instructors on the course's hub (deploy/jupyterhub/).

The hub passes the course id and the exchange (read from the course directory's nbgrader_config.py,
written by `python -m autograder course init`) to every server, so they are set in one place: no
learner ever sees "No course id specified", and the Assignment List shows this course only.
"""
import os

c = get_config()  # noqa: F821 (given by traitlets when nbgrader loads this file)

c.CourseDirectory.course_id = os.environ["TDD_COURSE_ID"]
c.Exchange.root = os.environ["TDD_EXCHANGE"]
# A submission readable only by its learner and the course's group, not by every user who guesses its name.
c.ExchangeFactory.submit = "autograder.course.PrivateSubmit"
