"""JupyterHub for one course on one server: `make hub` (as root), or
`.venv/bin/jupyterhub -f deploy/jupyterhub/jupyterhub_config.py` with the settings below.

Settings (environment variables; course_hub.py reads them):

* TDD_HUB_COURSE: the nbgrader course directory (`python -m autograder course init`), owned by the
  course's system user, who runs formgrader; its nbgrader_config.py gives the course id and the exchange.
* TDD_HUB_EDITION: the student edition learners' servers run (`python -m autograder publish`).
* TDD_HUB_INSTRUCTORS: the instructors' system users, comma-separated.
* TDD_HUB_STATE (default: hub-state beside the course directory), TDD_HUB_IP (127.0.0.1), TDD_HUB_PORT
  (8000), TDD_HUB_API_PORT (8081), TDD_HUB_PROXY_API_PORT (8001), TDD_HUB_SERVICE_PORT (8082).

Who gets what:

* users log in with their system password (PAM); learners are the students of the course's
  gradebook (`course init --students`, read at each login), instructors those named above;
* each learner's and instructor's server runs as that user (course_hub.view_command: learners see
  the student edition, their home and the exchange; instructors the full repository) with the
  Assignment List (fetch, submit, fetch feedback) and Validate;
* instructors reach the course's service, /services/<course id>/: formgrader and a terminal, running
  as the course's user in the course directory with the grading tools.

The hub runs as root: it reads /etc/shadow for PAM and starts each server as its user.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import course_hub  # noqa: E402
from jupyterhub.auth import PAMAuthenticator  # noqa: E402
from jupyterhub.spawner import LocalProcessSpawner  # noqa: E402

c = get_config()  # noqa: F821 (given by traitlets when JupyterHub loads this file)
cfg = course_hub.settings()
cfg.state.mkdir(mode=0o700, parents=True, exist_ok=True)


class CourseAuthenticator(PAMAuthenticator):
    """PAM, for the course's students (read from its gradebook at each login) and its instructors."""

    def check_allowed(self, username, authentication=None):
        return username in cfg.instructors or username in course_hub.students(cfg)


class CourseSpawner(LocalProcessSpawner):
    """LocalProcessSpawner whose server runs in the user's view (bubblewrap, then setpriv to the user)."""

    def make_preexec_fn(self, name):
        return None  # bubblewrap needs root to assemble the view; setpriv switches to the user inside it

    async def start(self):
        kind = "instructor" if self.user.name in cfg.instructors else "learner"
        self.cmd = course_hub.view_command(kind, self.user.name, cfg) + [sys.executable, "-m", "jupyterhub.singleuser"]
        self.environment = course_hub.view_environment(kind, self.user.name, cfg)
        return await super().start()


c.JupyterHub.bind_url = f"http://{cfg.ip}:{cfg.port}"
c.JupyterHub.hub_bind_url = f"http://127.0.0.1:{cfg.api_port}"
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{cfg.proxy_api_port}"
c.ConfigurableHTTPProxy.command = [str(course_hub.HERE / "node_modules" / ".bin" / "configurable-http-proxy")]
c.ConfigurableHTTPProxy.pid_file = str(cfg.state / "proxy.pid")
c.JupyterHub.db_url = f"sqlite:///{cfg.state / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(cfg.state / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(cfg.state / "jupyterhub.pid")
c.JupyterHub.cleanup_servers = True  # stopping the hub stops every server and the service

c.JupyterHub.authenticator_class = CourseAuthenticator
c.Authenticator.any_allow_config = True  # who may log in is CourseAuthenticator.check_allowed's decision
c.PAMAuthenticator.open_sessions = False  # no systemd-logind session per login (containers have none)
c.JupyterHub.spawner_class = CourseSpawner
c.Spawner.default_url = "/lab"
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120

# The course's service: formgrader (and a terminal with the grading tools) as the course's user,
# in the course directory, for every instructor.
c.JupyterHub.services = [{
    "name": cfg.course_id,
    "url": f"http://127.0.0.1:{cfg.service_port}",
    "command": course_hub.view_command("course", cfg.course_user, cfg) + [sys.executable, "-m", "jupyterhub.singleuser"],
    "cwd": str(cfg.course_dir),
    "environment": {**course_hub.view_environment("course", cfg.course_user, cfg),
                    "JUPYTERHUB_DEFAULT_URL": "/formgrader"},
    "oauth_no_confirm": True,
    "timeout": 180,  # seconds for the service to answer at start; the hub stops if it does not (30 by default)
}]
c.JupyterHub.load_groups = {"instructors": {"users": list(cfg.instructors)}}
c.JupyterHub.load_roles = [{
    "name": f"instructors-of-{cfg.course_id}",
    "groups": ["instructors"],
    "scopes": [f"access:services!service={cfg.course_id}", "list:services", f"read:services!service={cfg.course_id}"],
}]
