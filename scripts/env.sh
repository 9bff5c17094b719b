# Sourced by scripts/setup and scripts/python: where the project's Python environment lives.
# The virtual environment is keyed by the hash of requirements.lock, so a changed lock file
# builds a new one and an unchanged one is reused as it is.
KERNELRL_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KERNELRL_CACHE="${KERNELRL_CACHE:-$HOME/.cache/kernelrl}"
kernelrl_lock_hash() { sha256sum "$KERNELRL_ROOT/scripts/requirements.lock" | cut -c1-16; }
KERNELRL_VENV="$KERNELRL_CACHE/venv-$(kernelrl_lock_hash)"
# The tracking libraries' environment (scripts/tracking.lock), keyed the same way.
kernelrl_tracking_hash() { sha256sum "$KERNELRL_ROOT/scripts/tracking.lock" | cut -c1-16; }
KERNELRL_TRACKING_VENV="$KERNELRL_CACHE/tracking-$(kernelrl_tracking_hash)"
