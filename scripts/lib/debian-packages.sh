# Sourced by the scripts that need Debian packages (test.sh, rdkafka-suite.sh).

# Installs the Debian packages named that are not installed, as root or through sudo.
install_debian_packages() {
    local need=() package
    for package in "$@"; do
        dpkg -s "$package" >/dev/null 2>&1 || need+=("$package")
    done
    [ "${#need[@]}" -gt 0 ] || return 0
    echo "installing: ${need[*]}"
    local sudo_cmd=""
    [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${need[@]}" >/dev/null
}
