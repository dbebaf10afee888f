# Read by bash in the terminals of `make lab` (see jupyter_server_config.py next to this file).
if [ -f "$HOME/.bashrc" ]; then . "$HOME/.bashrc"; fi
if [ -n "${VIRTUAL_ENV:-}" ] && [ -d "$VIRTUAL_ENV/bin" ]; then
  PATH="$VIRTUAL_ENV/bin:$PATH"
  export PATH
fi
