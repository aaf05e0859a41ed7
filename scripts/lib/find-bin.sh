# shellcheck shell=bash
# find_bin NAME: prints the path of program NAME, looked up in PATH and then in the sbin
# directories an ordinary user's PATH lacks (Debian puts nginx and redis-server there);
# returns 1 when there is none. Sourced by the scripts that need system programs.
find_bin() {
    local name=$1 d
    if command -v "$name" >/dev/null 2>&1; then
        command -v "$name"
        return 0
    fi
    for d in /usr/sbin /usr/local/sbin /sbin /usr/bin /usr/local/bin; do
        if [[ -x $d/$name ]]; then
            echo "$d/$name"
            return 0
        fi
    done
    return 1
}
