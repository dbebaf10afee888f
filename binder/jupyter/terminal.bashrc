# Read by bash in the terminals of `make lab` and Binder (see jupyter_server_config.py next to this file).
if [ -f "$HOME/.bashrc" ]; then . "$HOME/.bashrc"; fi
if [ -n "${VIRTUAL_ENV:-}" ] && [ -d "$VIRTUAL_ENV/bin" ]; then
  PATH="$VIRTUAL_ENV/bin:$PATH"
  export PATH
fi
# A terminal opened without a folder of its own starts where the server started (Binder: the repository):
# the course prints its commands for the work folder, so start there.
if [ -n "${TDD_WORK:-}" ] && [ -d "$TDD_WORK" ] && [ -n "${TDD_SERVER_DIR:-}" ] && [ "$PWD" = "$TDD_SERVER_DIR" ]; then
  cd "$TDD_WORK" || true
fi
