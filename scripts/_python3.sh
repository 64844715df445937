# Sourced by scripts/install and scripts/test: python3 runs everything else, so it comes first
# (installed here as root on Debian; otherwise one line says how).
if ! command -v python3 >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv
  else
    echo "anyformer: python3 is missing; install it with: sudo apt-get update && sudo apt-get install -y python3 python3-venv" >&2
    exit 1
  fi
fi
