# Sourced by the install scripts: install_debian_packages LABEL PACKAGE... installs, with apt
# (through sudo when not root), those of the packages that are not installed yet. When all are
# there it changes nothing and touches no network.
install_debian_packages() {
  local label=$1
  shift
  local missing=() package
  for package in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$package")
    fi
  done
  if [ ${#missing[@]} -eq 0 ]; then
    echo "$label: all $# packages present"
    return 0
  fi
  echo "$label: installing ${missing[*]}"
  local sudo_cmd=()
  if [ "$(id -u)" -ne 0 ]; then
    sudo_cmd=(sudo)
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
}
