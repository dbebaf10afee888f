# Terminals run a non-login bash, which keeps the server's environment (PATH and VIRTUAL_ENV: `python` is
# the course's); a login shell would read /etc/profile, which resets PATH on Debian and Ubuntu.
c.ServerApp.terminado_settings = {"shell_command": ["/bin/bash"]}  # noqa: F821
