#!/usr/bin/env bash
# Install, upgrade or remove hayakoe-pi on Raspberry Pi OS (64-bit) or Debian: 13 (trixie) or 12 (bookworm).
#
#   sudo ./install.sh [--voice NAME] [--models-from DIR] [--name NAME] [--area AREA] [--no-start]
#                     [--lan-broker [--lan-interface IFACE]...]
#   sudo ./install.sh --uninstall [--purge]
#
# Installs the apt packages it needs, a system user "hayakoe-pi" (in group
# audio), a virtualenv in /opt/hayakoe-pi/venv with this checkout in it and exactly
# the package versions that were tested (locks/runtime.txt, hash-checked), the
# config /etc/hayakoe-pi/config.yaml (only when absent: your edits are never
# overwritten; a newer default lands beside it as config.yaml.new; the first
# install gives this Pi its own device.id, unique per installed OS, and its
# name and area in Home Assistant), BERT and
# one voice in /var/lib/hayakoe-pi/models (downloaded from Hugging Face
# lemondouble/hayakoe, size- and sha256-checked, resumable; or copied with
# --models-from), a loopback-only mosquitto when the config points at this
# machine and no broker answers there, and the systemd service hayakoe-pi.
# Running it again upgrades in place (printing the packages whose versions change)
# and skips what is already complete.
#
# --uninstall stops and removes the service, /opt/hayakoe-pi and the
# /usr/local/bin/hayakoe-pi link, and keeps the config, models and cache;
# with --purge it removes those, the user and the mosquitto drop-in as well:
# every file the service and the CLI made (tools/install-check compares the
# whole file tree with the one before the install).
#
# Test hooks (environment; unset on a real install):
#   HAYAKOE_ROOT=DIR       prefix every system path written (/opt, /etc,
#                          /var/lib, /var/cache, /usr/local/bin) with DIR;
#                          systemctl is then skipped too.
#   HAYAKOE_SKIP_SYSTEM=1  skip apt-get, the service user (files are owned by
#                          the caller instead), mosquitto and systemctl.
#   HAYAKOE_MACHINE=ARCH   what `uname -m` would say (the 32-bit check, and a new
#                          config's engine.decoder: auto on aarch64).
#   HAYAKOE_HF_BASE=URL    download models from URL/<path> instead of
#                          https://huggingface.co/lemondouble/hayakoe/resolve/main
#                          (plain http only here: the tests' local stand-in)
set -euo pipefail
umask 022  # the venv and models must be readable by the service user

ROOT="${HAYAKOE_ROOT:-}"
SKIP_SYSTEM="${HAYAKOE_SKIP_SYSTEM:-0}"
HF_BASE="${HAYAKOE_HF_BASE:-https://huggingface.co/lemondouble/hayakoe/resolve/main}"
SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

SVC=hayakoe-pi
OPT_DIR="$ROOT/opt/hayakoe-pi"
VENV="$OPT_DIR/venv"
BIN_LINK="$ROOT/usr/local/bin/hayakoe-pi"
ETC_DIR="$ROOT/etc/hayakoe-pi"
CONFIG="$ETC_DIR/config.yaml"
STATE_DIR="$ROOT/var/lib/hayakoe-pi"
CACHE_DIR="$ROOT/var/cache/hayakoe-pi"
UNIT="$ROOT/etc/systemd/system/hayakoe-pi.service"
MOSQUITTO_CONF="$ROOT/etc/mosquitto/conf.d/hayakoe-pi.conf"
MOSQUITTO_PASSWORDS="$ROOT/etc/mosquitto/hayakoe-pi.passwd"  # the LAN listener's users (--lan-broker)
# mosquitto-clients: mosquitto_pub and mosquitto_sub, to try the service (and Home Assistant's broker)
APT_PACKAGES=(python3-venv python3-pip libportaudio2 alsa-utils curl ca-certificates mosquitto-clients)
# The model layout and the default voice come from the package (hayakoe_pi/layout.py): the
# default voice read from it as text (a minimal system has no python3 before the apt step),
# the file lists by running it once python3 is there.
DEFAULT_VOICE="$(sed -n 's/^DEFAULT_VOICE = "\([A-Za-z0-9._-]*\)"$/\1/p' "$SRC/hayakoe_pi/layout.py")"
[ -n "$DEFAULT_VOICE" ] || { echo "install.sh: error: no DEFAULT_VOICE in $SRC/hayakoe_pi/layout.py" >&2; exit 1; }
# without systemd, which otherwise makes mosquitto's /run folder for its pid file
MOSQUITTO_BY_HAND="sudo install -d -o mosquitto /run/mosquitto && sudo mosquitto -d -c /etc/mosquitto/mosquitto.conf"

say() { printf '%s\n' "$*"; }
step() { printf '\n==> %s\n' "$*"; }
warn() { printf 'warning: %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

usage() {
    cat <<EOF
Usage: sudo $0 [options]

Install or upgrade hayakoe-pi (offline Japanese text to speech over MQTT).

  --voice NAME        voice to install (default: voice.name from the config,
                      else $DEFAULT_VOICE), e.g. jvnv-F1-jp, jvnv-M1-jp, tsukuyomi_chan
  --models-root DIR   allow models.dir under DIR (default: only under /var/lib)
  --models-from DIR   copy BERT and the voice from DIR (HayaKoe layout:
                      onnx/bert/q8/bert_q8.onnx, bert/tokenizer/, onnx/speakers/<voice>/)
                      instead of downloading them from Hugging Face
  --name NAME         what Home Assistant calls this Pi, e.g. Kitchen (default: the
                      host name); its device.id, the part of its MQTT topics, is made
                      from it and /etc/machine-id on the first install and then kept
  --area AREA         the Home Assistant area to suggest for it, e.g. Kitchen
  --lan-broker        open the local broker to the LAN (Home Assistant on another
                      host): a listener that wants a user name and password on each
                      network interface; makes users for Home Assistant and the
                      service and prints Home Assistant's; this machine's own
                      listener (127.0.0.1) stays as it is
  --lan-interface I   the interface(s) to listen on (default: every wired and
                      wireless one, e.g. eth0 and wlan0); implies --lan-broker
  --no-start          install and enable the service, but do not (re)start it
  --uninstall         stop and remove the service and /opt/hayakoe-pi; keep the
                      config (/etc/hayakoe-pi), models and cache
  --purge             with --uninstall: also remove the config, models, cache,
                      state, the hayakoe-pi user, the mosquitto drop-in and
                      its LAN users: every file the service and the CLI made
  -h, --help          show this help
EOF
}

# --- arguments ------------------------------------------------------------------------
VOICE_ARG=""
NAME_ARG=""
AREA_ARG=""
LAN_BROKER=0
LAN_INTERFACES=()
MODELS_FROM=""
MODELS_ROOT=/var/lib
NO_START=0
UNINSTALL=0
PURGE=0
while [ $# -gt 0 ]; do
    case "$1" in
        --voice) [ $# -ge 2 ] || die "--voice needs a name"; VOICE_ARG="$2"; shift 2 ;;
        --voice=*) VOICE_ARG="${1#*=}"; shift ;;
        --models-from) [ $# -ge 2 ] || die "--models-from needs a directory"; MODELS_FROM="$2"; shift 2 ;;
        --models-from=*) MODELS_FROM="${1#*=}"; shift ;;
        --models-root) [ $# -ge 2 ] || die "--models-root needs a directory"; MODELS_ROOT="$2"; shift 2 ;;
        --models-root=*) MODELS_ROOT="${1#*=}"; shift ;;
        --name) [ $# -ge 2 ] || die "--name needs a name"; NAME_ARG="$2"; shift 2 ;;
        --name=*) NAME_ARG="${1#*=}"; shift ;;
        --area) [ $# -ge 2 ] || die "--area needs a name"; AREA_ARG="$2"; shift 2 ;;
        --area=*) AREA_ARG="${1#*=}"; shift ;;
        --lan-broker) LAN_BROKER=1; shift ;;
        --lan-interface) [ $# -ge 2 ] || die "--lan-interface needs a name"; LAN_BROKER=1
            LAN_INTERFACES+=("$2"); shift 2 ;;
        --lan-interface=*) LAN_BROKER=1; LAN_INTERFACES+=("${1#*=}"); shift ;;
        --no-start) NO_START=1; shift ;;
        --uninstall) UNINSTALL=1; shift ;;
        --purge) PURGE=1; shift ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; die "unknown option: $1" ;;
    esac
done
[ "$PURGE" = 0 ] || [ "$UNINSTALL" = 1 ] || die "--purge only goes with --uninstall"
if [ -n "$VOICE_ARG" ] && ! [[ "$VOICE_ARG" =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]]; then
    die "bad voice name '$VOICE_ARG' (letters, digits, '.', '_' and '-' only)"
fi
if [ -n "$MODELS_FROM" ]; then
    [ -d "$MODELS_FROM" ] || die "--models-from: no such directory: $MODELS_FROM"
    MODELS_FROM="$(cd "$MODELS_FROM" && pwd)"
fi
if [ "$SKIP_SYSTEM" != 1 ] && [ "$(id -u)" != 0 ]; then
    die "run me as root: sudo $0 $*"
fi

# --- what cannot work, said before anything is changed --------------------------------
if [ "$UNINSTALL" = 0 ]; then
    MACHINE="${HAYAKOE_MACHINE:-$(uname -m)}"
    case "$MACHINE" in
        aarch64 | arm64 | x86_64) ;;
        armv6l | armv7l | armv8l | armhf)
            die "this is a 32-bit ARM system ($MACHINE), for which onnxruntime has no wheel:" \
                "install Raspberry Pi OS (64-bit) (a Pi 3, Zero 2 W, 4 or 5 runs it) and run me again" ;;
        *) die "onnxruntime has no wheel for $MACHINE: this installer is for aarch64 and x86_64" ;;
    esac
    # A new config's engine.decoder: on a Pi the 8-bit decoder where its gate passes (README)
    case "$MACHINE" in aarch64 | arm64) NEW_DECODER=auto ;; *) NEW_DECODER=fp32 ;; esac
fi
# A name of the model layout, read from hayakoe_pi/layout.py as text (a minimal system has no
# python3 before the apt step): NAME = "a" or NAME = ("a", "b") → a, or a b.
layout() { sed -n "s/^$1 = //p" "$SRC/hayakoe_pi/layout.py" | tr -d '()",'; }
# The files voice $1 needs (layout.required_files, the same list once python3 is there).
layout_required() {
    local name
    layout BERT_PATH
    for name in $(layout TOKENIZER_FILES); do echo "$(layout TOKENIZER_DIR)/$name"; done
    for name in $(layout VOICE_FILES); do echo "$(layout SPEAKERS_DIR)/$1/$name"; done
}
if [ -n "$MODELS_FROM" ] && [ "$UNINSTALL" = 0 ]; then
    [ -f "$MODELS_FROM/onnx/bert/q8/bert_q8.onnx" ] ||
        die "--models-from $MODELS_FROM has no onnx/bert/q8/bert_q8.onnx (a HayaKoe-layout models folder has" \
            "onnx/bert/q8/, bert/tokenizer/ and onnx/speakers/<voice>/)"
    FROM_VOICES=()
    for f in "$MODELS_FROM"/onnx/speakers/*/synthesizer.onnx; do
        if [ -f "$f" ]; then FROM_VOICES+=("$(basename "$(dirname "$f")")"); fi
    done
    [ ${#FROM_VOICES[@]} -gt 0 ] && mapfile -t FROM_VOICES < <(printf '%s\n' "${FROM_VOICES[@]}" | LC_ALL=C sort)
    [ ${#FROM_VOICES[@]} -gt 0 ] || die "--models-from $MODELS_FROM has no voice (onnx/speakers/<voice>/synthesizer.onnx)"
    if [ -z "$VOICE_ARG" ]; then
        [ ${#FROM_VOICES[@]} -eq 1 ] ||
            die "$MODELS_FROM has the voices ${FROM_VOICES[*]}: choose one with --voice NAME"
        VOICE_ARG="${FROM_VOICES[0]}"
        say "voice: $VOICE_ARG (the only one in $MODELS_FROM)"
    elif [ ! -f "$MODELS_FROM/onnx/speakers/$VOICE_ARG/synthesizer.onnx" ]; then
        die "--models-from $MODELS_FROM has no onnx/speakers/$VOICE_ARG/synthesizer.onnx;" \
            "its voices: ${FROM_VOICES[*]}"
    fi
    lacking=()
    while read -r rel; do [ -f "$MODELS_FROM/$rel" ] || lacking+=("$rel"); done < <(layout_required "$VOICE_ARG")
    [ ${#lacking[@]} -eq 0 ] ||
        die "--models-from $MODELS_FROM lacks ${lacking[*]} (a HayaKoe-layout models folder has" \
            "onnx/bert/q8/bert_q8.onnx, bert/tokenizer/ and onnx/speakers/<voice>/); nothing was changed"
fi

# systemctl only on a host booted with systemd, and only for the real root.
have_systemd() { [ "$SKIP_SYSTEM" != 1 ] && [ -z "$ROOT" ] && [ -d /run/systemd/system ]; }

if [ "$SKIP_SYSTEM" = 1 ]; then
    OWNER="$(id -u):$(id -g)"
    CONFIG_GROUP="$(id -g)"
else
    OWNER="$SVC:$SVC"
    CONFIG_GROUP="$SVC"
fi

# --- uninstall ------------------------------------------------------------------------
uninstall() {
    step "Removing the hayakoe-pi service"
    if have_systemd; then
        systemctl disable --now "$SVC.service" 2>/dev/null || true
    elif [ "$SKIP_SYSTEM" != 1 ] && [ -z "$ROOT" ]; then
        say "systemd is not running: nothing to stop"
    fi
    rm -f "$UNIT"
    if have_systemd; then
        systemctl daemon-reload
        systemctl reset-failed "$SVC.service" 2>/dev/null || true
    fi
    # the service is stopped: take its device out of Home Assistant while the venv is here
    if [ -x "$VENV/bin/hayakoe-pi" ] && [ -f "$CONFIG" ]; then
        if ! "$VENV/bin/hayakoe-pi" forget --config "$CONFIG"; then
            warn "Home Assistant still lists the device: delete it there (Settings > Devices > HayaKoe Pi)," \
                "or run this again once the broker answers"
        fi
    fi
    rm -rf "$OPT_DIR"
    if [ -L "$BIN_LINK" ]; then rm -f "$BIN_LINK"; fi
    say "removed $UNIT, $OPT_DIR and $BIN_LINK"
    if [ "$PURGE" = 1 ]; then
        # /root/.cache/hayakoe-pi: what `sudo hayakoe-pi ...` of older versions made; /var/tmp: an
        # interrupted install's downloads
        rm -rf "$ETC_DIR" "$STATE_DIR" "$CACHE_DIR" "$ROOT/etc/systemd/system/$SVC.service.d" \
            "$ROOT/root/.cache/hayakoe-pi" "$ROOT/var/tmp/hayakoe-pi-models"
        say "removed $ETC_DIR, $STATE_DIR (models, state) and $CACHE_DIR"
        # onnxruntime's telemetry id and database, which `sudo hayakoe-pi ...` of older versions left
        # in root's home (this version stops onnxruntime from writing them)
        ort="$ROOT/root/.cache/Microsoft/DeveloperTools/.onnxruntime"
        if [ -d "$ort" ]; then
            rm -rf "$ort"
            rmdir "$(dirname "$ort")" "$(dirname "$(dirname "$ort")")" 2>/dev/null || true  # if nothing else is there
            say "removed $ort (onnxruntime's telemetry id)"
        fi
        if [ -f "$MOSQUITTO_CONF" ]; then
            rm -f "$MOSQUITTO_CONF" "$MOSQUITTO_PASSWORDS"
            say "removed $MOSQUITTO_CONF (the mosquitto package itself stays)"
            if have_systemd; then systemctl try-restart mosquitto.service || true; fi
        fi
        if [ "$SKIP_SYSTEM" != 1 ] && id "$SVC" >/dev/null 2>&1; then
            userdel "$SVC" || warn "could not remove the user $SVC"
            if getent group "$SVC" >/dev/null; then groupdel "$SVC" || true; fi
            say "removed the user $SVC"
        fi
    else
        say "kept $ETC_DIR (config), $STATE_DIR (models, state) and $CACHE_DIR;"
        say "remove them too with: sudo $0 --uninstall --purge"
    fi
}

if [ "$UNINSTALL" = 1 ]; then
    uninstall
    exit 0
fi

for f in pyproject.toml locks/runtime.txt config.yaml systemd/hayakoe-pi.service; do
    [ -f "$SRC/$f" ] || die "run me from a hayakoe-pi checkout ($SRC/$f is missing)"
done

# --- apt packages ---------------------------------------------------------------------
APT_UPDATED=0
apt_install() {
    local missing=() pkg
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    [ ${#missing[@]} -gt 0 ] || return 0
    say "apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    if [ "$APT_UPDATED" = 0 ]; then
        apt-get update -q
        APT_UPDATED=1
    fi
    apt-get install -y -q --no-install-recommends "${missing[@]}"
}

if [ "$SKIP_SYSTEM" != 1 ]; then
    step "System packages"
    command -v apt-get >/dev/null || die "apt-get not found: this installer is for Debian / Raspberry Pi OS"
    apt_install "${APT_PACKAGES[@]}"
fi
# The system's Python, not one under /root (pyenv etc.) that the service user cannot run.
PYTHON=/usr/bin/python3
[ -x "$PYTHON" ] || PYTHON="$(command -v python3)" || die "python3 not found"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
    die "Python 3.11 or newer is needed (Raspberry Pi OS or Debian 12 or 13); $PYTHON is $("$PYTHON" -V 2>&1)"
command -v curl >/dev/null || [ -n "$MODELS_FROM" ] || die "curl not found"

# --- service user ---------------------------------------------------------------------
if [ "$SKIP_SYSTEM" != 1 ]; then
    step "Service user $SVC"
    if ! getent group "$SVC" >/dev/null; then groupadd --system "$SVC"; fi
    if ! id "$SVC" >/dev/null 2>&1; then
        useradd --system --gid "$SVC" --groups audio --home-dir /var/lib/hayakoe-pi --no-create-home \
            --shell /usr/sbin/nologin --comment "hayakoe-pi text to speech" "$SVC"
        say "created the system user $SVC"
    else
        usermod --append --groups audio "$SVC"
        say "the user $SVC exists"
    fi
fi

# --- virtualenv -----------------------------------------------------------------------
step "Python virtualenv $VENV"
py_version() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2], sys.base_prefix)' 2>/dev/null; }
if [ -d "$VENV" ] && [ "$(py_version "$VENV/bin/python")" != "$(py_version "$PYTHON")" ]; then
    say "the virtualenv does not fit $PYTHON (an OS upgrade?): making it anew"
    rm -rf "$VENV"
fi
NEW_VENV=0
if [ ! -x "$VENV/bin/python" ]; then
    mkdir -p "$OPT_DIR"
    "$PYTHON" -m venv "$VENV"
    NEW_VENV=1
fi
# Build from a copy, so the checkout gets no build/ or *.egg-info (and may be read-only).
BUILD_DIR="$(mktemp -d)"
cleanup() { rm -rf "$BUILD_DIR"; }
trap cleanup EXIT
tar -C "$SRC" --exclude=./.git --exclude=./.venv --exclude=./build --exclude='*.egg-info' \
    --exclude=./tests --exclude=./bench --exclude=__pycache__ -cf - . | tar -C "$BUILD_DIR" -xf -
# Exactly the versions that were tested, each file checked against the lock's hashes, then this
# checkout without dependencies (built with the lock's setuptools: nothing unlocked is fetched).
# --no-cache-dir: nothing left in /root/.cache/pip (--purge removes what the install made)
pip_install() {
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-warn-script-location --no-cache-dir "$@"
}
venv_packages() { "$VENV/bin/python" -m pip list --disable-pip-version-check --format=freeze 2>/dev/null | LC_ALL=C sort; }
before="$(venv_packages)"
pip_install --require-hashes -r "$SRC/locks/runtime.txt" ||
    die "pip could not install the tested versions (locks/runtime.txt) into $VENV (see above: is PyPI reachable?" \
        "a hash that does not match is a file other than the one tested); nothing was installed or restarted:" \
        "the program as it was keeps running"
pip_install --no-deps --no-build-isolation --upgrade "$BUILD_DIR" ||
    die "pip could not install hayakoe-pi into $VENV (see above)"
# what an upgrade changed, package by package (a new virtualenv: only how many)
LC_ALL=C join -t= -a1 -a2 -e - -o 0,1.3,2.3 <(printf '%s\n' "$before" | grep -F '==') <(venv_packages | grep -F '==') |
    awk -F= -v fresh="$NEW_VENV" '
        $1 == "hayakoe-pi" || $2 == $3 { next }
        fresh { n++; next }
        { print "  " $1 " " ($2 == "-" ? "(new)" : $2) " -> " ($3 == "-" ? "removed" : $3); n++ }
        END { if (fresh) print "  installed " n " packages (locks/runtime.txt)"; else if (!n) print "  no package changed" }'
say "installed $("$VENV/bin/python" -m pip --disable-pip-version-check show hayakoe-pi 2>/dev/null |
    sed -n 's/^Version: /hayakoe-pi /p')"
mkdir -p "$(dirname "$BIN_LINK")"
ln -sfn /opt/hayakoe-pi/venv/bin/hayakoe-pi "$BIN_LINK"

# Settings of a config file, checked as the service checks it (omitted keys take
# the defaults), one per line; a config the service would refuse stops the install.
read_config() {
    "$VENV/bin/python" - "$1" <<'EOF'
import sys
from hayakoe_pi.settings.config import ConfigError, load_config

try:
    c = load_config(sys.argv[1])
except ConfigError as e:
    sys.exit(f"install.sh: error: {e}")
for value in (c.mqtt.host, c.mqtt.port, c.mqtt.topic_prefix, c.voice.name, c.models.dir, c.audio.device,
              c.device.id, c.device.name, c.device.area, c.mqtt.username, c.engine.decoder):
    print("" if value is None else str(value).replace("\n", " "))
EOF
}

# A YAML scalar for text $1 (JSON's double-quoted string is one), escaped for sed's
# replacement; null when empty.
yaml_text() {
    if [ -z "$1" ]; then echo null; return; fi
    "$PYTHON" -c 'import json, sys; print(json.dumps(sys.argv[1], ensure_ascii=False))' "$1" |
        sed 's/[\\&|]/\\&/g'
}

# The repo's default config $1 with voice.name set to $2, audio.device to $3
# (if given; a name without double quotes), device.id, name and area to $4-$6,
# and engine.decoder to $7 (if given).
default_config() {
    local device
    device="$(printf '%s' "${3:-default}" | sed 's/[\\&|]/\\&/g')"
    if [ "$device" != default ]; then device="\"$device\""; fi
    sed -E -e "/^voice:/,/^[^[:space:]#]/ s/^(  name:[[:space:]]*)[^[:space:]#]+/\\1$2/" \
        -e "/^audio:/,/^[^[:space:]#]/ s|^(  device:[[:space:]]*)default|\\1$device|" \
        -e "/^device:/,/^[^[:space:]#]/ s|^(  id:[[:space:]]*)null|\\1${4:-null}|" \
        -e "/^device:/,/^[^[:space:]#]/ s|^(  name:[[:space:]]*)null|\\1$(yaml_text "${5:-}")|" \
        -e "/^device:/,/^[^[:space:]#]/ s|^(  area:[[:space:]]*)null|\\1$(yaml_text "${6:-}")|" \
        -e "/^engine:/,/^[^[:space:]#]/ s/^(  decoder:[[:space:]]*)fp32/\\1${7:-fp32}/" "$1"
}

# This Pi's device.id: its name (or host name) as a-z0-9 and -, and 6 hex digits of
# /etc/machine-id, which is unique per installed OS (every Pi OS image is "raspberrypi").
new_device_id() {
    local slug seed
    slug="$(printf '%s' "$1" | tr '[:upper:]' '[:lower:]' | sed -E 's/[^a-z0-9]+/-/g; s/^-+//' | cut -c1-32 |
        sed -E 's/-+$//')"
    seed="$(cat "$ROOT/etc/machine-id" 2>/dev/null || cat /etc/machine-id 2>/dev/null ||
        od -An -tx1 -N16 /dev/urandom | tr -d ' \n')"
    printf '%s-%s\n' "${slug:-pi}" "$(printf 'hayakoe-pi %s' "$seed" | sha256sum | cut -c1-6)"
}

# Replace the (untouched) config with the default naming voice $1 and device $2,
# this Pi's identity (DEVICE_ID, DEVICE_NAME, DEVICE_AREA) and its decoder (CONFIG_DECODER).
write_default_config() {
    local tmp
    tmp="$(mktemp "$CONFIG.XXXXXX")"
    default_config "$SRC/config.yaml" "$1" "$2" "$DEVICE_ID" "$DEVICE_NAME" "$DEVICE_AREA" "$CONFIG_DECODER" >"$tmp"
    own_config "$tmp"
    mv -f "$tmp" "$CONFIG"
}

# The config may hold the MQTT password: root:hayakoe-pi 0640.
own_config() {
    chmod 0640 "$1"
    chown "root:$CONFIG_GROUP" "$1" 2>/dev/null || chown ":$CONFIG_GROUP" "$1"
}

# --- config ---------------------------------------------------------------------------
step "Config $CONFIG"
mkdir -p "$ETC_DIR"
chmod 0755 "$ETC_DIR"
CONFIG_IS_DEFAULT=0
if [ ! -e "$CONFIG" ]; then
    DEVICE_NAME="${NAME_ARG:-$(cat /proc/sys/kernel/hostname 2>/dev/null || echo pi)}"
    DEVICE_ID="$(new_device_id "$DEVICE_NAME")"
    DEVICE_AREA="$AREA_ARG"
    CONFIG_DECODER="$NEW_DECODER"
    write_default_config "${VOICE_ARG:-$DEFAULT_VOICE}" default
    say "installed the default config: device.id $DEVICE_ID, name $DEVICE_NAME${DEVICE_AREA:+, area $DEVICE_AREA}," \
        "engine.decoder $CONFIG_DECODER"
    CONFIG_IS_DEFAULT=1
else
    mapfile -t current < <(read_config "$CONFIG")
    CONFIG_DECODER="${current[10]:-fp32}"  # an existing config keeps its own
    # "Untouched": the default, except perhaps for the voice, device, identity and decoder this installer set.
    if default_config "$SRC/config.yaml" "${current[3]:-}" "${current[5]:-}" "${current[6]:-}" "${current[7]:-}" \
        "${current[8]:-}" "$CONFIG_DECODER" | cmp -s - "$CONFIG"; then
        CONFIG_IS_DEFAULT=1
        say "kept $CONFIG (the default settings)"
    else
        say "kept $CONFIG (edited by you)"
        # this version's defaults, naming the voice being installed and this Pi's identity
        default_config "$SRC/config.yaml" "${VOICE_ARG:-${current[3]:-$DEFAULT_VOICE}}" "" "${current[6]:-}" \
            "${current[7]:-}" "${current[8]:-}" "$NEW_DECODER" >"$CONFIG.new.tmp"
        if cmp -s "$CONFIG.new.tmp" "$CONFIG.new" 2>/dev/null; then
            rm -f "$CONFIG.new.tmp"
        else
            own_config "$CONFIG.new.tmp"
            mv -f "$CONFIG.new.tmp" "$CONFIG.new"
        fi
        say "note: the default config of this version is in $CONFIG.new;"
        say "      compare with: diff -u $CONFIG $CONFIG.new"
    fi
fi
own_config "$CONFIG"

mapfile -t cfg < <(read_config "$CONFIG")
[ ${#cfg[@]} -eq 11 ] || die "could not read $CONFIG (above); fix it and run me again"
MQTT_HOST="${cfg[0]}"
MQTT_PORT="${cfg[1]}"
TOPIC_PREFIX="${cfg[2]}"
CONFIG_VOICE="${cfg[3]}"
MODELS_DIR="$ROOT${cfg[4]}"
# Root makes this folder and everything in it: never a system folder given by a typo (/var/lib,
# /etc), never a path with .. or links in it (checked again before the models are placed).
MODELS_ROOT="${MODELS_ROOT%/}"
case "${cfg[4]}/" in
    "$MODELS_ROOT"/?*/) ;;
    *) die "models.dir ${cfg[4]} in $CONFIG must be a folder under $MODELS_ROOT/ (e.g. /var/lib/hayakoe-pi/models);" \
        "to keep the models elsewhere, name the folder above it with --models-root DIR" ;;
esac
case "${cfg[4]}/" in */../* | */./* | *//*) die "models.dir ${cfg[4]} in $CONFIG must be a plain absolute path" ;; esac
CONFIG_DEVICE="${cfg[5]}"
DEVICE_ID="${cfg[6]}"
DEVICE_NAME="${cfg[7]}"
DEVICE_AREA="${cfg[8]}"
MQTT_USER="${cfg[9]}"
CONFIG_DECODER="${cfg[10]}"

# --name and --area on an upgrade: the untouched config takes them, an edited one is pointed out
if { [ -n "$NAME_ARG" ] && [ "$NAME_ARG" != "$DEVICE_NAME" ]; } ||
    { [ -n "$AREA_ARG" ] && [ "$AREA_ARG" != "$DEVICE_AREA" ]; }; then
    if [ "$CONFIG_IS_DEFAULT" = 1 ] && [ -n "$DEVICE_ID" ]; then
        DEVICE_NAME="${NAME_ARG:-$DEVICE_NAME}"
        DEVICE_AREA="${AREA_ARG:-$DEVICE_AREA}"
        write_default_config "$CONFIG_VOICE" "$CONFIG_DEVICE"
        say "set device.name: $DEVICE_NAME${DEVICE_AREA:+, device.area: $DEVICE_AREA} in $CONFIG"
    else
        warn "$CONFIG is yours: set device.name and device.area there to rename this Pi in Home Assistant"
    fi
fi
if [ -z "$DEVICE_ID" ]; then
    say "note: this Pi has no device.id (installed before there could be several): it keeps its Home Assistant"
    say "      entities (notify.hayakoe_pi_say, ...); before adding a second Pi, give each its own device.id"
    say "      (device section of $CONFIG.new, or: device: {id: kitchen, name: Kitchen})"
fi

VOICE="${VOICE_ARG:-$CONFIG_VOICE}"
VOICE="${VOICE:-$DEFAULT_VOICE}"
[[ "$VOICE" =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || die "bad voice.name '$VOICE' in $CONFIG"
if [ "$VOICE" != "$CONFIG_VOICE" ]; then
    if [ "$CONFIG_IS_DEFAULT" = 1 ]; then
        write_default_config "$VOICE" "$CONFIG_DEVICE"
        say "set voice.name: $VOICE in $CONFIG"
    else
        warn "$CONFIG uses voice $CONFIG_VOICE; to speak with $VOICE, set voice.name: $VOICE there" \
            "(or publish it to $TOPIC_PREFIX/voice/set)"
    fi
fi

# --- sound card -----------------------------------------------------------------------
# Desktop Pi OS hands ALSA's "default" to PipeWire in the logged-in user's
# session, which the service cannot reach: it needs the card itself.
if [ "$CONFIG_DEVICE" = default ]; then
    why="$(mktemp)"
    rc=0
    suggestion="$("$VENV/bin/hayakoe-pi" devices --suggest 2>"$why")" || rc=$?
    reason="$(tail -n 1 "$why")"  # the last line: PortAudio may print ALSA noise before it
    rm -f "$why"
    if [ "$rc" = 0 ] && [ "$suggestion" != default ]; then
        step "Sound card: $reason"
        if [ "$CONFIG_IS_DEFAULT" = 1 ] && [[ "$suggestion" != *'"'* ]]; then
            write_default_config "$VOICE" "$suggestion"
            say "set audio.device: \"$suggestion\" in $CONFIG (the others: hayakoe-pi devices)"
        else
            warn "set audio.device: \"$suggestion\" in $CONFIG (the others: hayakoe-pi devices)"
        fi
    elif [ "$rc" = 1 ]; then
        step "Sound card: $reason"
        warn "no sound card found: connect one, then set audio.device in $CONFIG to its name" \
            "(hayakoe-pi devices lists them)"
    elif [ "$rc" != 0 ]; then
        warn "could not list the sound cards: $reason"
    fi
fi

# --- mosquitto ------------------------------------------------------------------------
# shellcheck disable=SC2016  # $1 and $2 belong to the inner bash
broker_answers() { timeout 2 bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "$1" "$2" 2>/dev/null; }

# The broker drop-in this version writes (mosquitto/make-conf): for this machine only, and
# with --lan-broker (or a drop-in that had it) a listener wanting a password on the LAN.
our_mosquitto_conf() {
    local listen=127.0.0.1
    if [ "$MQTT_HOST" = "::1" ]; then listen="::1"; fi
    if [ ${#LAN_INTERFACES[@]} -gt 0 ]; then
        "$SRC/mosquitto/make-conf" "$MQTT_PORT" "$listen" "${MOSQUITTO_PASSWORDS#"$ROOT"}" "${LAN_INTERFACES[@]}"
    else
        "$SRC/mosquitto/make-conf" "$MQTT_PORT" "$listen"
    fi
}

# --lan-broker: the interfaces (named, those the drop-in had, else every physical one), and
# the users: one for Home Assistant, one for the service, each with its own random password,
# kept (for printing again) in a file only root reads.
LAN_CREDENTIALS="$ETC_DIR/mqtt-lan-credentials"
if [ "$LAN_BROKER" = 0 ] && [ -f "$MOSQUITTO_CONF" ] && grep -q '^bind_interface ' "$MOSQUITTO_CONF"; then
    LAN_BROKER=1  # kept on upgrade
    [ ${#LAN_INTERFACES[@]} -gt 0 ] || mapfile -t LAN_INTERFACES < <(sed -n 's/^bind_interface //p' "$MOSQUITTO_CONF")
fi
if [ "$LAN_BROKER" = 1 ] && [ ${#LAN_INTERFACES[@]} -eq 0 ]; then
    for net in /sys/class/net/*; do
        case "$(readlink -f "$net")" in */virtual/*) continue ;; esac  # lo, bridges, docker, veth
        LAN_INTERFACES+=("$(basename "$net")")
    done
    [ ${#LAN_INTERFACES[@]} -gt 0 ] || die "--lan-broker: no network interface found; name one with --lan-interface"
fi

lan_users() {
    local user password
    touch "$LAN_CREDENTIALS"
    chmod 0600 "$LAN_CREDENTIALS"
    for user in homeassistant hayakoe-pi; do
        if ! grep -q "^$user:" "$MOSQUITTO_PASSWORDS" 2>/dev/null || ! grep -q "^$user " "$LAN_CREDENTIALS"; then
            password="$(head -c 18 /dev/urandom | base64 | tr -d '/+=')"
            if [ -f "$MOSQUITTO_PASSWORDS" ]; then mosquitto_passwd -b "$MOSQUITTO_PASSWORDS" "$user" "$password"
            else mosquitto_passwd -c -b "$MOSQUITTO_PASSWORDS" "$user" "$password"; fi
            sed -i "/^$user /d" "$LAN_CREDENTIALS"
            printf '%s %s\n' "$user" "$password" >>"$LAN_CREDENTIALS"
        fi
    done
    chown mosquitto:mosquitto "$MOSQUITTO_PASSWORDS"
    chmod 0640 "$MOSQUITTO_PASSWORDS"
}

lan_password() { sed -n "s/^$1 //p" "$LAN_CREDENTIALS"; }

# Write it and (re)start the broker with it.
install_mosquitto_conf() {
    mkdir -p "$(dirname "$MOSQUITTO_CONF")"
    our_mosquitto_conf >"$MOSQUITTO_CONF"
    chmod 0644 "$MOSQUITTO_CONF"
    say "wrote $MOSQUITTO_CONF"
    if have_systemd; then
        systemctl enable mosquitto.service
        systemctl restart mosquitto.service
    else
        warn "systemd is not running: start the broker with: $MOSQUITTO_BY_HAND"
    fi
}

if [ "$SKIP_SYSTEM" != 1 ]; then
    case "$MQTT_HOST" in
        localhost | 127.0.0.1 | ::1)
            if [ "$LAN_BROKER" = 1 ]; then
                step "MQTT broker: open to the LAN on ${LAN_INTERFACES[*]}, with a password"
                apt_install mosquitto
                lan_users
                install_mosquitto_conf
                if [ -z "$MQTT_USER" ] && [ "$CONFIG_IS_DEFAULT" = 1 ]; then
                    sed -i -E -e "/^mqtt:/,/^[^[:space:]#]/ s/^(  username:[[:space:]]*)null/\1hayakoe-pi/" \
                        -e "/^mqtt:/,/^[^[:space:]#]/ s/^(  password:[[:space:]]*)null/\1\"$(lan_password hayakoe-pi)\"/" \
                        "$CONFIG"
                    say "set mqtt.username and mqtt.password (the service's own user) in $CONFIG"
                elif [ -z "$MQTT_USER" ]; then
                    warn "$CONFIG is yours: to give the service its own user, set mqtt.username: hayakoe-pi and" \
                        "mqtt.password: (in $LAN_CREDENTIALS)"
                fi
            elif [ -f "$MOSQUITTO_CONF" ] && head -n 1 "$MOSQUITTO_CONF" | grep -q "^# Written by hayakoe-pi" &&
                ! our_mosquitto_conf | cmp -s - "$MOSQUITTO_CONF"; then
                step "MQTT broker: updating the drop-in an older version wrote (this machine only, per listener)"
                install_mosquitto_conf
            elif broker_answers "$MQTT_HOST" "$MQTT_PORT"; then
                step "MQTT broker: one answers on $MQTT_HOST:$MQTT_PORT, leaving it alone"
            elif [ ! -f "$MOSQUITTO_CONF" ] && dpkg-query -W -f='${Status}' mosquitto 2>/dev/null |
                grep -q "install ok installed"; then
                step "MQTT broker: mosquitto is installed but nothing answers on $MQTT_HOST:$MQTT_PORT"
                if have_systemd; then start="sudo systemctl enable --now mosquitto"
                else start="$MOSQUITTO_BY_HAND"; fi
                warn "not touching your mosquitto setup; start it with: $start" \
                    "(if it still does not answer on port $MQTT_PORT, see its log: /var/log/mosquitto/mosquitto.log)"
            else
                step "MQTT broker: installing mosquitto for this machine only ($MQTT_HOST:$MQTT_PORT)"
                apt_install mosquitto
                install_mosquitto_conf
            fi
            ;;
        *) step "MQTT broker: $MQTT_HOST:$MQTT_PORT (not this machine; nothing to install)" ;;
    esac
fi

# --- models ---------------------------------------------------------------------------
mapfile -t REQUIRED_FILES < <("$PYTHON" "$SRC/hayakoe_pi/layout.py" required "$VOICE")
mapfile -t OPTIONAL_FILES < <("$PYTHON" "$SRC/hayakoe_pi/layout.py" optional "$VOICE")
[ ${#REQUIRED_FILES[@]} -gt 0 ] || die "cannot read the model layout from $SRC/hayakoe_pi/layout.py"

# Does file $1 have size $2 and sha256 $3 (each checked only when not empty)?
# On a mismatch MISMATCH says how.
MISMATCH=""
file_matches() {
    local actual
    MISMATCH=""
    if [ -n "$2" ]; then
        actual="$(stat -c %s "$1")"
        if [ "$actual" != "$2" ]; then
            MISMATCH="size $actual bytes, expected $2"
            return 1
        fi
    fi
    if [ -n "$3" ]; then
        actual="$(sha256sum "$1" | cut -d' ' -f1)"
        if [ "$actual" != "$3" ]; then
            MISMATCH="sha256 $actual, expected $3"
            return 1
        fi
    fi
    return 0
}

# HEAD headers (of every redirect hop) → "size sha256" as published: X-Linked-*
# (Hugging Face's LFS files) else the final Content-Length/ETag; the ETag
# counts as a checksum only when it is a 64-hex sha256 (LFS files).
published_size_and_sha() {
    awk '
        /^HTTP\// { cl = ""; et = ""; next }
        {
            line = $0; sub(/\r$/, "", line)
            key = tolower(line); sub(/:.*/, "", key)
            value = line; sub(/^[^:]*:[ \t]*/, "", value); sub(/[ \t]+$/, "", value)
            if (key == "x-linked-size" && xs == "") xs = value
            else if (key == "x-linked-etag" && xe == "") xe = value
            else if (key == "content-length") cl = value
            else if (key == "etag") et = value
        }
        END {
            size = (xs != "" ? xs : cl); tag = tolower(xe != "" ? xe : et)
            sub(/^w\//, "", tag); gsub(/"/, "", tag)
            if (size !~ /^[0-9]+$/) size = "-"
            if (tag !~ /^[0-9a-f]+$/ || length(tag) != 64) tag = "-"
            print size, tag
        }' "$1"
}

CURL_PROGRESS=(-sS)
if [ -t 2 ]; then CURL_PROGRESS=(--progress-bar); fi
CURL_PROTO=(--proto "=https" --proto-redir "=https")  # never a plain http hop, even by a redirect
if [[ "$HF_BASE" == http://* ]]; then CURL_PROTO=(--proto "=http,https" --proto-redir "=http,https"); fi

# Downloads and copies go to a folder only root can touch (resumable across runs), and are
# placed into the models folder once whole and checked: root never writes through a name in a
# folder the service user owns. The models are root's, read-only for the service.
STAGE="$ROOT/var/tmp/hayakoe-pi-models"
if [ -L "$STAGE" ] || { [ -e "$STAGE" ] && [ "$(stat -c %u "$STAGE")" != "$(id -u)" ]; }; then rm -rf "$STAGE"; fi
mkdir -p "$ROOT/var/tmp"
install -d -m 0700 "$STAGE"
STAGED=()  # relative paths staged, to place

# No link anywhere in the models folder's path or tree: the layout has none; one planted there
# (by a compromised service account) is removed, so that nothing below is judged through it.
models_dir_without_links() {
    [ "$(realpath -m "$MODELS_DIR")" = "$MODELS_DIR" ] ||
        die "models.dir $MODELS_DIR goes through a symbolic link; point models.dir at the folder itself"
    if [ -d "$MODELS_DIR" ]; then find "$MODELS_DIR" -type l -delete; fi
}
models_dir_without_links

download() {  # download RELATIVE_PATH required|optional (into $STAGE)
    local rel="$1" need="$2" url="$HF_BASE/$1" dest="$MODELS_DIR/$1" part="$STAGE/$1.part"
    local headers code size sha rc
    headers="$(mktemp)"
    code="$(curl "${CURL_PROTO[@]}" -sSIL --connect-timeout 20 --retry 5 -o /dev/null -D "$headers" \
        -w '%{http_code}' "$url")" ||
        { rm -f "$headers"; die "cannot reach $url (no network?); or install offline with --models-from DIR"; }
    if [ "$code" = 404 ] && [ "$need" = optional ]; then
        rm -f "$headers"
        say "  $rel: not published (optional), skipped"
        return 0
    fi
    if [ "$code" = 404 ]; then
        rm -f "$headers"
        die "$rel not found at $url: is '$VOICE' the name of a HayaKoe voice?"
    fi
    [ "$code" = 200 ] || { rm -f "$headers"; die "$url answered HTTP $code"; }
    read -r size sha < <(published_size_and_sha "$headers")
    rm -f "$headers"
    [ "$size" != - ] || size=""
    [ "$sha" != - ] || sha=""
    if [ -f "$dest" ] && [ ! -L "$dest" ] && file_matches "$dest" "$size" "$sha"; then
        say "  $rel: complete"
        return 0
    fi
    mkdir -p "$(dirname "$part")"
    if [ -f "$part" ] && [ -n "$size" ] && [ "$(stat -c %s "$part")" -gt "$size" ]; then
        rm -f "$part"  # longer than the published file: cannot be a prefix of it
    fi
    if [ -f "$part" ] && [ -n "$size" ] && [ "$(stat -c %s "$part")" = "$size" ]; then
        say "  $rel: already downloaded, checking"
    else
        if [ -f "$part" ]; then
            say "  $rel: resuming at $(stat -c %s "$part") bytes"
        else
            say "  $rel: downloading${size:+ ($size bytes)}"
        fi
        rc=0
        curl "${CURL_PROTO[@]}" -fL --retry 5 --connect-timeout 20 "${CURL_PROGRESS[@]}" -C - -o "$part" "$url" ||
            rc=$?
        if [ "$rc" = 33 ]; then  # the server cannot resume: start over
            rm -f "$part"
            rc=0
            curl "${CURL_PROTO[@]}" -fL --retry 5 --connect-timeout 20 "${CURL_PROGRESS[@]}" -o "$part" "$url" ||
                rc=$?
        fi
        [ "$rc" = 0 ] || die "downloading $rel from $url failed (curl exit code $rc); run me again to resume"
    fi
    if ! file_matches "$part" "$size" "$sha"; then
        rm -f "$part"
        die "downloaded $rel is damaged: $MISMATCH (as published at $url); deleted it, run me again to retry"
    fi
    STAGED+=("$rel")
}

copy_model() {  # copy RELATIVE_PATH from $MODELS_FROM (into $STAGE)
    local rel="$1" src="$MODELS_FROM/$1" dest="$MODELS_DIR/$1"
    if [ -f "$dest" ] && [ ! -L "$dest" ] && cmp -s "$src" "$dest"; then
        say "  $rel: complete"
        return 0
    fi
    mkdir -p "$(dirname "$STAGE/$rel")"
    cp -f "$src" "$STAGE/$rel.part"
    STAGED+=("$rel")
    say "  $rel: copied"
}

if [ -n "$MODELS_FROM" ]; then
    step "Models: copying BERT and voice $VOICE from $MODELS_FROM to $MODELS_DIR"
    missing=()
    for rel in "${REQUIRED_FILES[@]}"; do
        [ -f "$MODELS_FROM/$rel" ] || missing+=("$rel")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        die "$MODELS_FROM lacks ${missing[*]} (expected the HayaKoe layout; is '$VOICE' the voice's folder name?)"
    fi
    for rel in "${REQUIRED_FILES[@]}"; do copy_model "$rel"; done
    for rel in "${OPTIONAL_FILES[@]}"; do
        if [ -f "$MODELS_FROM/$rel" ]; then copy_model "$rel"; fi
    done
else
    step "Models: BERT and voice $VOICE from $HF_BASE to $MODELS_DIR"
    for rel in "${REQUIRED_FILES[@]}"; do download "$rel" required; done
    for rel in "${OPTIONAL_FILES[@]}"; do download "$rel" optional; done
fi

# --- ownership ------------------------------------------------------------------------
step "Permissions"
if [ ${#STAGED[@]} -gt 0 ] && have_systemd && systemctl -q is-active "$SVC.service"; then
    systemctl stop "$SVC.service"  # nothing of the service's runs while root works in its folder
fi
mkdir -p "$STATE_DIR" "$CACHE_DIR" "$MODELS_DIR"
models_dir_without_links  # again, the service stopped
find "$STATE_DIR" "$CACHE_DIR" -path "$MODELS_DIR" -prune -o -exec chown -h "$OWNER" {} +
chmod 0700 "$STATE_DIR" "$CACHE_DIR"
if [ "$SKIP_SYSTEM" != 1 ]; then chown -R -h root:root "$MODELS_DIR"; fi
chmod -R u+rwX,go+rX,go-w "$MODELS_DIR"
for rel in "${STAGED[@]}"; do
    mkdir -p "$(dirname "$MODELS_DIR/$rel")"
    install -m 0644 "$STAGE/$rel.part" "$MODELS_DIR/$rel"  # unlinks what is there first, follows nothing
    rm -f "$STAGE/$rel.part"
done
rm -rf "$STAGE"
say "$STATE_DIR and $CACHE_DIR: owner $OWNER, mode 0700; $MODELS_DIR: the models, read-only for $SVC"

# --- derived model files -------------------------------------------------------------
# Made now, one model at a time in a child process each (a first start that made
# them all at once would not fit a 1 GB Pi); a rerun finds them made and skips.
# With the config's decoder: the 8-bit one made here too, not at the service's start.
step "Models: preparing BERT and voice $VOICE (once per model file)"
if [ "$CONFIG_DECODER" != fp32 ]; then
    say "engine.decoder $CONFIG_DECODER: the 8-bit decoder is made and checked too, the first time: preparing" \
        "takes about 3x as long (estimated: a Pi 4 6-8 minutes instead of 2-3, a Pi 5 a third of that;" \
        "379-430 s against 125-144 s on 2 busy x86 cores; README: On a Pi)"
fi
prepare=("$VENV/bin/hayakoe-pi" prepare --models "$MODELS_DIR" --cache "$CACHE_DIR" --voice "$VOICE"
    --decoder "$CONFIG_DECODER")
if [ "$SKIP_SYSTEM" != 1 ]; then prepare=(runuser -u "$SVC" -- "${prepare[@]}"); fi
if ! "${prepare[@]}" 2>&1 | sed 's/^/  /'; then
    say "WARNING: preparing the models failed (above); the service will try again when it starts"
fi

# --- systemd --------------------------------------------------------------------------
step "systemd service $SVC"
RUNNING=0
mkdir -p "$(dirname "$UNIT")"
install -m 0644 "$SRC/systemd/hayakoe-pi.service" "$UNIT"
say "installed $UNIT"
if have_systemd; then
    systemctl daemon-reload
    systemctl enable "$SVC.service"
    if [ "$NO_START" = 1 ]; then
        say "enabled; not started (--no-start): sudo systemctl start $SVC"
    elif systemctl restart "$SVC.service"; then
        RUNNING=1
        say "started: $(systemctl show -P StatusText "$SVC.service")"
    else
        warn "the service did not start; see: journalctl -u $SVC -n 50"
        say "check the setup with: sudo $VENV/bin/hayakoe-pi check --config /etc/hayakoe-pi/config.yaml"
        exit 1
    fi
elif [ "$SKIP_SYSTEM" = 1 ] || [ -n "$ROOT" ]; then
    say "systemctl skipped (test install)"
else
    warn "systemd is not running here, so the service is installed but not started;" \
        "on a host booted with systemd: sudo systemctl daemon-reload && sudo systemctl enable --now $SVC;" \
        "or in the foreground: sudo -u $SVC $VENV/bin/hayakoe-pi run --config /etc/hayakoe-pi/config.yaml"
fi

say ""
if [ "$LAN_BROKER" = 1 ] && [ "$SKIP_SYSTEM" != 1 ]; then
    say "Home Assistant (Settings > Devices & services > Add integration > MQTT): broker $(cat /proc/sys/kernel/hostname 2>/dev/null || echo this-pi).local" \
        "(or its address), port $MQTT_PORT, user homeassistant, password $(lan_password homeassistant)" \
        "(kept in $LAN_CREDENTIALS, readable by root only)"
fi
# QoS 1: the broker keeps the message until it is spoken (the README's test publish)
SPEAK="mosquitto_pub -h $MQTT_HOST -p $MQTT_PORT${MQTT_USER:+ -u $MQTT_USER -P PASSWORD} -q 1 -t $TOPIC_PREFIX/say -m 'こんにちは'"
if [ "$RUNNING" = 1 ]; then
    say "Done. Make it speak: $SPEAK   Logs: journalctl -u $SVC -f"
else
    say "Installed, not running. Check the setup with: sudo $VENV/bin/hayakoe-pi check --config /etc/hayakoe-pi/config.yaml;" \
        "once it runs: $SPEAK"
fi
