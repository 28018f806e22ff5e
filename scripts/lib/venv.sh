# Sourced: a Python virtualenv pinned to a requirements file, made once and
# made again only when the file changes.
# Usage: ensure_venv DIR REQUIREMENTS
ensure_venv() {
    local venv=$1 requirements=$2
    if ! python3 -m venv --help >/dev/null 2>&1; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
            apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
        else
            echo "python3 with the venv module is needed (apt-get install python3-venv)" >&2; return 1
        fi
    fi
    if [ ! -x "$venv/bin/python" ] || ! cmp -s "$requirements" "$venv/requirements.txt"; then
        rm -rf "$venv"
        python3 -m venv "$venv"
        "$venv/bin/pip" install -q --disable-pip-version-check -r "$requirements"
        cp "$requirements" "$venv/requirements.txt"
    fi
}
