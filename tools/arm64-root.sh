# Sourced by tools/arm64-check and tools/qemu-count: Raspberry Pi OS 64-bit's userland
# (Debian arm64's Python, the wheels of locks/runtime.txt) to run under qemu user mode.
#
# Nothing is registered with the kernel (no binfmt_misc: it is shared) and the
# host's dpkg is not touched: qemu comes out of Debian's .deb, the arm64 root is
# made of .debs unpacked with dpkg -x, fetched with a private apt configuration
# over the host's sources. Downloads stay in the work folder given to each function.
# The functions stop at the first error under the caller's `set -e` (call them plainly, not in `||`).
# shellcheck shell=bash

arm64_work_default() {  # where downloads are kept between runs
    echo "${XDG_CACHE_HOME:-$HOME/.cache}/hayakoe-pi-arm64"
}

# shellcheck disable=SC2034  # the variables these functions set are for the scripts that source this file
arm64_cpu() {  # pi4|pi5: sets qemu_cpu, cpu_name
    case $1 in
        pi4) qemu_cpu=cortex-a72; cpu_name="Raspberry Pi 4 (Cortex-A72)" ;;
        pi5) qemu_cpu=cortex-a76; cpu_name="Raspberry Pi 5 (Cortex-A76)" ;;
        *) echo "--cpu is pi4 or pi5, not $1" >&2; return 2 ;;
    esac
}

arm64_suite_python() {  # SUITE: sets py, the Python each Raspberry Pi OS release has
    case $1 in
        trixie) py=3.13 ;;
        bookworm) py=3.11 ;;
        *) echo "--suite is trixie or bookworm, not $1" >&2; return 2 ;;
    esac
}

arm64_host_check() {  # HOST_PYTHON
    if [ ! -x "$1" ]; then
        echo "$1 is missing: run ./tools/run-tests first (it makes .venv)" >&2
        return 2
    fi
    if [ "$(uname -m)" != x86_64 ] || ! command -v apt-get >/dev/null; then
        echo "needs an x86_64 Debian host with apt-get (this is $(uname -m))" >&2
        return 2
    fi
}

arm64_qemu_static() {  # WORK: sets qemu, qemu-aarch64-static from the host's own Debian package
    qemu=$1/qemu/usr/bin/qemu-aarch64-static
    if [ ! -x "$qemu" ]; then
        echo "fetching qemu-user-static"
        rm -rf "$1/qemu" && mkdir -p "$1/qemu" && (cd "$1/qemu" && apt-get download -q qemu-user-static >/dev/null 2>&1 &&
            dpkg-deb --fsys-tarfile qemu-user-static_*.deb | tar -x ./usr/bin/qemu-aarch64-static && rm qemu-user-static_*.deb)
    fi
}

arm64_sysroot() {  # WORK SUITE: sets sysroot, Python and libportaudio2 with what they depend on
    local work=$1 suite=$2 apt mirror packages deb dir
    arm64_suite_python "$suite"
    sysroot=$work/sysroot-$suite
    if [ ! -x "$sysroot/usr/bin/python$py" ]; then
        echo "fetching Debian $suite arm64: python$py, libportaudio2"
        apt=$work/apt
        rm -rf "$apt" "$sysroot" && mkdir -p "$apt/state/lists/partial" "$apt/cache/archives/partial" "$apt/debs" \
            "$apt/parts" "$sysroot"
        touch "$apt/state/status"
        mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
        echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] ${mirror:-http://deb.debian.org/debian} $suite main" \
            >"$apt/sources.list"
        cat > "$apt/apt.conf" <<EOF
APT::Architecture "arm64";
APT::Architectures { "arm64"; };
Dir::State "$apt/state";
Dir::State::status "$apt/state/status";
Dir::Cache "$apt/cache";
Dir::Etc::SourceList "$apt/sources.list";
Dir::Etc::SourceParts "$apt/parts";
Dir::Etc::PreferencesParts "$apt/parts";
EOF
        export APT_CONFIG=$apt/apt.conf
        apt-get update -qq -o APT::Sandbox::User=root
        packages=$(apt-get -s install --no-install-recommends "python$py" libportaudio2 | awk '/^Inst /{print $2}')
        # shellcheck disable=SC2086  # one word per package
        (cd "$apt/debs" && apt-get download -q -o APT::Sandbox::User=root $packages >/dev/null)
        unset APT_CONFIG
        for deb in "$apt/debs"/*.deb; do dpkg -x "$deb" "$sysroot"; done
        rm -rf "$apt"
    fi
    # Debian 13's packages put everything in /usr; its base system (not unpacked here) links /lib to it,
    # where the program loader is looked for
    for dir in lib bin sbin; do [ -e "$sysroot/$dir" ] || ln -s "usr/$dir" "$sysroot/$dir"; done
}

arm64_cpuinfo() {  # SYSROOT pi4|pi5: the /proc/cpuinfo the guest reads
    # Bookworm's qemu shows the guest the host's x86 /proc/cpuinfo, on which
    # onnxruntime's CPU detection crashes; -L hands the guest this one instead.
    local n cpu_part
    case $2 in pi4) cpu_part=0xd08 ;; pi5) cpu_part=0xd0b ;; esac
    mkdir -p "$1/proc"
    {
        for n in 0 1 2 3; do
            printf 'processor\t: %s\nBogoMIPS\t: 108.00\nFeatures\t: fp asimd evtstrm crc32 cpuid%s\n' \
                "$n" "$([ "$2" = pi5 ] && echo ' atomics fphp asimdhp asimdrdm lrcpc dcpop asimddp')"
            printf 'CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x%s\nCPU part\t: %s\nCPU revision\t: %s\n\n' \
                "$([ "$2" = pi5 ] && echo 4 || echo 0)" "$cpu_part" "$([ "$2" = pi5 ] && echo 1 || echo 3)"
        done
    } > "$1/proc/cpuinfo"
}

arm64_site() {  # WORK SUITE HOST_PYTHON: sets site, the arm64 wheels of locks/runtime.txt, hash-checked
    local work=$1 host_python=$3 glibc platform
    arm64_suite_python "$2"
    site=$work/site-$2-$(sha256sum <locks/runtime.txt | cut -c1-12)
    if [ ! -d "$site" ]; then
        echo "fetching the arm64 wheels of locks/runtime.txt for Python $py"
        platform=(--python-version "$py" --only-binary=:all:)  # the wheels a Pi's glibc (2.36 on Debian 12) can load
        for glibc in $(seq 17 36); do platform+=(--platform "manylinux_2_${glibc}_aarch64"); done
        platform+=(--platform manylinux2014_aarch64)
        rm -rf "$work/wheels" "$site.tmp"
        pip() { "$host_python" -m pip "$@" --disable-pip-version-check 2>&1 | { grep -v '^WARNING: Location' || true; }; }
        pip download -q --progress-bar off --dest "$work/wheels" "${platform[@]}" --require-hashes -r locks/runtime.txt
        pip install -q --no-deps --target "$site.tmp" "${platform[@]}" "$work/wheels"/*.whl
        rm -rf "$work/wheels"
        mv "$site.tmp" "$site"
    fi
}
