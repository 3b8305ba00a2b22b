# Sourced by tools/install-check and tools/ha-check: a minbase Debian root made with
# debootstrap, that reaches this machine's registries, and its mounts for a chroot.
# shellcheck shell=bash

debian_mirror() {  # the host's Debian mirror (its apt sources), else Debian's own
    awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null | grep . ||
        echo http://deb.debian.org/debian
}

debian_root_make() {  # SUITE ROOT LOG: debootstrap; its log's end on failure
    debootstrap --variant=minbase "$1" "$2" "$(debian_mirror)" >"$3" 2>&1 || { tail -20 "$3" >&2; return 1; }
}

# What the root needs to reach the registries this machine reaches: DNS, localhost, and the CA
# bundle pip is told to trust (a fresh Debian has only the public CAs: PIP_CERT below).
debian_root_network() {  # ROOT
    cp -L /etc/resolv.conf "$1/etc/resolv.conf"
    # what the Debian installer (not debootstrap) writes
    printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' >"$1/etc/hosts"
    local host_ca=${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}
    if [ -f "$host_ca" ]; then cp -L "$host_ca" "$1/etc/host-ca.crt"; fi
}

debian_root_mount() {  # ROOT: /proc, /sys and /dev for a chroot
    mount -t proc proc "$1/proc"
    mount --rbind /sys "$1/sys"
    mount --bind /dev "$1/dev"
    mount --bind /dev/pts "$1/dev/pts"
}

debian_root_umount() {  # ROOT: what debian_root_mount mounted (lazily: a process may linger)
    local m
    for m in dev/pts dev sys proc; do
        if mountpoint -q "$1/$m" 2>/dev/null; then umount -l "$1/$m"; fi
    done
}

debian_chrooted() {  # ROOT: sets `chrooted`, the command prefix that runs a command in the root
    # shellcheck disable=SC2034  # used by the scripts that source this file
    chrooted=(chroot "$1" /usr/bin/env -i PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
              LANG=C.UTF-8 PIP_CERT=/etc/host-ca.crt PIP_DEFAULT_TIMEOUT=180)
}
