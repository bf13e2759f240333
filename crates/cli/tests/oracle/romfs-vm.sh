#!/usr/bin/env bash
# romfs-vm.sh: Linux's own romfs driver as a test oracle. Boots a Debian
# kernel under qemu with the image as a read-only virtio disk, loads
# romfs.ko, mounts the image and prints the walk of what the kernel shows,
# in the line format of walk.rs beside this script (the test harness prints
# a foliofs mount with the same code, so the two can be compared as text).
#
#   romfs-vm.sh IMAGE      the walk of IMAGE as Linux reads it, on stdout
#   romfs-vm.sh --prepare  only fetch and build what the VM needs
#
# Exit: 0 walked; 1 usage, or something the VM needs could not be had;
#       2 the kernel refused the mount; 3 qemu failed or timed out;
#       4 the walk did not finish (the lines it printed are on stdout).
# stderr: "romfs-vm: ..." notes; when a run fails, the guest's kernel log.
#
# The first use downloads the kernel package with apt-get (about 70 MB) and
# builds an initramfs (static busybox, the walker compiled static with
# rustc, the modules romfs and a virtio disk need) into the cache; later
# runs take a few seconds.
#
# Environment:
#   FOLIOFS_ORACLE_CACHE    cache directory (default /var/cache/foliofs-oracle)
#   FOLIOFS_ORACLE_KERNEL   Debian kernel package (default: the one
#                           linux-image-amd64 depends on; else the newest cached)
#   FOLIOFS_ORACLE_TIMEOUT  bound on one VM run, seconds (default 300)
#   FOLIOFS_ORACLE_ACCEL    kvm or tcg (default: KVM if a probe boot with it
#                           works, else emulation)
#   RUSTC                   compiler for the walker (default: rustc on PATH,
#                           else ~/.cargo/bin/rustc)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
tmp=
kernel=
initramfs=
cache=${FOLIOFS_ORACLE_CACHE:-/var/cache/foliofs-oracle}
vm_timeout=${FOLIOFS_ORACLE_TIMEOUT:-300}
# What romfs and the disk need; their dependencies are found in the modules.
want_modules=(romfs virtio_pci virtio_blk)

note() { echo "romfs-vm: $*" >&2; }
fail() {
    local rc=$1
    shift
    note "$*"
    exit "$rc"
}

usage() {
    echo "usage: romfs-vm.sh IMAGE | --prepare" >&2
    exit 1
}

have() { command -v "$1" >/dev/null 2>&1; }

check_tools() {
    local t
    for t in qemu-system-x86_64 busybox cpio gzip timeout flock; do
        have "$t" || fail 1 "needs $t (scripts/setup installs it)"
    done
    # The guest has no libraries: busybox must be the static build.
    if ldd "$(command -v busybox)" >/dev/null 2>&1; then
        fail 1 "busybox is dynamically linked; install busybox-static"
    fi
}

find_rustc() {
    if [ -n "${RUSTC:-}" ]; then
        echo "$RUSTC"
    elif have rustc; then
        command -v rustc
    elif [ -x "${HOME:-/root}/.cargo/bin/rustc" ]; then
        echo "${HOME:-/root}/.cargo/bin/rustc"
    else
        fail 1 "needs rustc to build the walker (set RUSTC)"
    fi
}

# The kernel package linux-image-amd64 depends on, if apt knows it.
metapackage_target() {
    { apt-cache depends linux-image-amd64 2>/dev/null || true; } |
        awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }'
}

# The kernel package to use: asked for, else what the metapackage points
# at, else (no package lists, no network) whatever is cached already.
kernel_package() {
    if [ -n "${FOLIOFS_ORACLE_KERNEL:-}" ]; then
        echo "$FOLIOFS_ORACLE_KERNEL"
        return
    fi
    local pkg
    pkg=$(metapackage_target)
    if [ -z "$pkg" ]; then
        pkg=$(ls -1 "$cache/kernel" 2>/dev/null | grep '^linux-image-' | sort -V | tail -n 1 || true)
    fi
    if [ -z "$pkg" ] && have apt-get; then
        note "no package lists: apt-get update"
        apt-get update -qq >&2 || true
        pkg=$(metapackage_target)
    fi
    [ -n "$pkg" ] || fail 1 "cannot tell which kernel package to use (set FOLIOFS_ORACLE_KERNEL)"
    echo "$pkg"
}

# The uncompressed kernel inside an xz-compressed bzImage, if it has a PVH
# entry point (an ELF note of type 18, XEN_ELFNOTE_PHYS32_ENTRY): qemu then
# starts it directly, and emulated decompression was half the boot time.
extract_vmlinux() {
    local off
    off=$(LC_ALL=C grep -m 1 -obUaP '\xfd7zXZ\x00' "$1" | cut -d: -f1 || true)
    [ -n "$off" ] || return 1
    tail -c +$((off + 1)) "$1" | xz -dc --single-stream >"$2" 2>/dev/null || true
    if [ "$(head -c 4 "$2" | od -An -tx1 | tr -d ' ')" = 7f454c46 ] &&
        LC_ALL=C grep -qaP '\x04\x00\x00\x00[\x04\x08]\x00\x00\x00\x12\x00\x00\x00Xen\x00' "$2"; then
        return 0
    fi
    rm -f "$2"
    return 1
}

# A module's dependencies, from the depends= string of its .modinfo.
module_deps() {
    tr '\0' '\n' <"$1" | sed -n '/^depends=/{s///;s/,/ /g;p;q}'
}

# Downloads the package and keeps vmlinuz, the modules we load (with
# everything they depend on) and the order to load them in.
fetch_kernel() {
    local pkg=$1 dir=$2 work deb
    have apt-get && have dpkg-deb || fail 1 "needs apt-get and dpkg-deb to fetch $pkg"
    work=$(mktemp -d "$cache/fetch.XXXXXX")
    chmod 755 "$work"
    note "downloading $pkg"
    if ! (cd "$work" && apt-get download "$pkg") >"$work/apt.log" 2>&1; then
        apt-get update -qq >>"$work/apt.log" 2>&1 || true
        if ! (cd "$work" && apt-get download "$pkg") >>"$work/apt.log" 2>&1; then
            cat "$work/apt.log" >&2
            rm -rf "$work"
            fail 1 "apt-get download $pkg failed"
        fi
    fi
    deb=$(ls "$work"/*.deb)
    mkdir "$work/root"
    dpkg-deb --fsys-tarfile "$deb" |
        tar -x -C "$work/root" --wildcards './boot/vmlinuz-*' '*.ko' '*.ko.xz' '*.ko.zst' 2>/dev/null ||
        true
    rm -rf "$dir.new"
    mkdir -p "$dir.new/modules"
    cp "$(ls "$work"/root/boot/vmlinuz-* | head -n 1)" "$dir.new/vmlinuz" ||
        fail 1 "$pkg holds no vmlinuz"
    extract_vmlinux "$dir.new/vmlinuz" "$dir.new/vmlinux" ||
        note "no bootable vmlinux inside vmlinuz: booting the compressed kernel (slower)"
    # Every module by its name (file names may say '-' where names say '_').
    declare -A path_of=()
    local f name
    while IFS= read -r f; do
        name=${f##*/}
        name=${name%%.ko*}
        path_of[${name//-/_}]=$f
    done < <(find "$work/root" -name '*.ko*')
    declare -A placed=()
    local order=()
    place() {
        local m=${1//-/_} src d
        [ -n "${placed[$m]:-}" ] && return
        placed[$m]=1
        src=${path_of[$m]:-}
        [ -n "$src" ] || fail 1 "$pkg has no module $m"
        case $src in
        *.xz) xz -dc "$src" >"$dir.new/modules/$m.ko" ;;
        *.zst) zstd -qdc "$src" >"$dir.new/modules/$m.ko" ;;
        *) cp "$src" "$dir.new/modules/$m.ko" ;;
        esac
        for d in $(module_deps "$dir.new/modules/$m.ko"); do
            place "$d"
        done
        order+=("$m")
    }
    for name in "${want_modules[@]}"; do
        place "$name"
    done
    printf '%s\n' "${order[@]}" >"$dir.new/modules/order"
    rm -rf "$work" "$dir"
    mv "$dir.new" "$dir"
}

# The guest's /init: load the modules, mount the disk, walk it, power off.
# Results go to the second serial port so the kernel's console messages
# cannot interleave with them.
write_init() {
    cat >"$1" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
exec 3>/dev/ttyS1
finish() {
    echo "@@log" >&3
    dmesg >&3
    echo "@@log-end" >&3
    # Closing the last descriptor waits until the port has sent everything.
    exec 3>&-
    poweroff -f
}
while read -r m; do
    if ! insmod "/modules/$m.ko" 2>/tmp/err; then
        echo "@@failed insmod $m: $(cat /tmp/err)" >&3
        finish
    fi
done </modules/order
i=0
while [ ! -b /dev/vda ] && [ $i -lt 200 ]; do
    usleep 50000
    i=$((i + 1))
done
# From here on the log holds only what the mount and the walk caused.
dmesg -c >/dev/null
if mount -t romfs -o ro /dev/vda /mnt 2>/tmp/err; then
    echo "@@walk" >&3
    timeout "${walk_timeout:-240}" /walker /mnt >&3 2>/tmp/err
    rc=$?
    echo "@@walk-end $rc $(cat /tmp/err)" >&3
    umount /mnt
else
    echo "@@mount-refused $(cat /tmp/err)" >&3
fi
finish
EOF
    chmod 755 "$1"
}

build_initramfs() {
    local kdir=$1 out=$2 stage rustc
    rustc=$(find_rustc)
    stage=$(mktemp -d "$cache/initramfs.XXXXXX")
    mkdir -p "$stage"/{bin,dev,proc,sys,mnt,tmp,modules}
    cp "$(command -v busybox)" "$stage/bin/busybox"
    cp "$kdir"/modules/* "$stage/modules/"
    write_init "$stage/init"
    note "building the walker with $rustc"
    "$rustc" --edition 2021 -C opt-level=2 -C panic=abort -C strip=symbols \
        -C target-feature=+crt-static -o "$stage/walker" "$here/guest.rs" >&2 ||
        fail 1 "cannot build the walker"
    (cd "$stage" && find . -mindepth 1 | LC_ALL=C sort |
        cpio -o -H newc -R 0:0 --quiet | gzip -1) >"$out.tmp"
    mv "$out.tmp" "$out"
    rm -rf "$stage"
}

# Makes sure the kernel and an initramfs for this script's sources are
# cached, and sets kernel and initramfs to them.
prepare() {
    local pkg kdir key
    mkdir -p "$cache/kernel"
    pkg=$(kernel_package)
    kdir=$cache/kernel/$pkg
    # One builder at a time; the others wait, then find it done.
    if [ ! -f "$kdir/vmlinuz" ]; then
        exec 9>"$cache/lock"
        flock 9
        [ -f "$kdir/vmlinuz" ] || fetch_kernel "$pkg" "$kdir"
        exec 9>&-
    fi
    key=$(cat "${BASH_SOURCE[0]}" "$here/walk.rs" "$here/guest.rs" \
        "$(command -v busybox)" "$kdir/modules/order" | sha256sum | cut -c1-16)
    initramfs=$cache/initramfs-$pkg-$key.cpio.gz
    if [ ! -f "$initramfs" ]; then
        exec 9>"$cache/lock"
        flock 9
        [ -f "$initramfs" ] || build_initramfs "$kdir" "$initramfs"
        exec 9>&-
    fi
    kernel=$kdir/vmlinuz
    if [ -f "$kdir/vmlinux" ]; then
        kernel=$kdir/vmlinux
    fi
}

# Prints the guest's log (what the mount and walk made the kernel say).
show_log() {
    sed -n '/^@@log$/,/^@@log-end$/p' "$1" | sed '1d;$d' | sed 's/^/romfs-vm: guest: /' >&2
}

# Boots the VM once: boot ACCEL DISK OUTDIR TIMEOUT; the guest's results
# land in OUTDIR/data, its console in OUTDIR/console. Returns qemu's status.
boot() {
    local accel=$1 disk=$2 out=$3 limit=$4 cpu=qemu64 rc=0
    # The plain 64-bit CPU emulates fastest; under KVM the host's is free.
    [ "$accel" = kvm ] && cpu=host
    timeout -k 10 "$limit" qemu-system-x86_64 \
        -nodefaults -no-user-config -display none -no-reboot \
        -accel "$accel" -cpu "$cpu" -smp 1 -m 128 \
        -kernel "$kernel" -initrd "$initramfs" \
        -append "console=ttyS0 quiet panic=-1 edd=off mitigations=off walk_timeout=$((limit - 30))" \
        -serial "file:$out/console" -serial "file:$out/data" \
        -drive "file=$disk,format=raw,if=virtio,readonly=on" \
        >"$out/qemu.log" 2>&1 || rc=$?
    return $rc
}

# The accelerator to use: FOLIOFS_ORACLE_ACCEL, else KVM if a probe boot
# with it works (tried once per host boot), else emulation.
choose_accel() {
    if [ -n "${FOLIOFS_ORACLE_ACCEL:-}" ]; then
        echo "$FOLIOFS_ORACLE_ACCEL"
        return
    fi
    if ! [ -r /dev/kvm ] || ! [ -w /dev/kvm ] || ! grep -qwE 'vmx|svm' /proc/cpuinfo; then
        echo tcg
        return
    fi
    local verdict probe
    verdict=$cache/kvm-$(cat /proc/sys/kernel/random/boot_id 2>/dev/null || echo unknown)
    if [ ! -f "$verdict" ]; then
        probe=$(mktemp -d)
        truncate -s 4096 "$probe/disk"
        if boot kvm "$probe/disk" "$probe" 60 && grep -q '^@@log-end' "$probe/data"; then
            echo kvm >"$verdict"
        else
            note "KVM does not boot the VM here; using emulation"
            echo tcg >"$verdict"
        fi
        rm -rf "$probe"
    fi
    cat "$verdict"
}

run() {
    local image=$1 disk size rc=0 data
    [ -f "$image" ] || fail 1 "$image is not a file"
    prepare
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    # A disk is whole sectors; pad a copy rather than have qemu round.
    disk=$image
    size=$(stat -c %s "$image")
    if [ $((size % 512)) -ne 0 ]; then
        disk=$tmp/disk
        cp "$image" "$disk"
        truncate -s $(((size + 511) / 512 * 512)) "$disk"
    fi
    boot "$(choose_accel)" "$disk" "$tmp" "$vm_timeout" || rc=$?
    data=$tmp/data
    [ -f "$data" ] && tr -d '\r' <"$data" >"$tmp/out" && data=$tmp/out
    if [ $rc -ne 0 ] || ! grep -q '^@@log-end$' "$data" 2>/dev/null; then
        [ $rc -eq 124 ] && note "qemu did not finish within ${vm_timeout}s"
        cat "$tmp/qemu.log" >&2
        tail -n 30 "$tmp/console" 2>/dev/null | tr -d '\r' | sed 's/^/romfs-vm: console: /' >&2
        # Whatever the walk printed before it was cut off.
        if grep -q '^@@walk$' "$data" 2>/dev/null; then
            sed -n '/^@@walk$/,$p' "$data" | sed '1d' | grep -v '^@@'
            fail 4 "the walk did not finish"
        fi
        fail 3 "qemu failed (exit $rc)"
    fi
    if grep -q '^@@failed' "$data"; then
        grep '^@@failed' "$data" | sed 's/^@@failed /romfs-vm: /' >&2
        show_log "$data"
        fail 1 "the guest could not load its modules"
    fi
    if grep -q '^@@mount-refused' "$data"; then
        sed -n 's/^@@mount-refused /romfs-vm: mount: /p' "$data" >&2
        show_log "$data"
        fail 2 "the kernel refused to mount $image"
    fi
    sed -n '/^@@walk$/,/^@@walk-end/p' "$data" | sed '1d;$d'
    local end
    end=$(sed -n 's/^@@walk-end //p' "$data")
    if [ "${end%% *}" != 0 ]; then
        show_log "$data"
        fail 4 "the walk did not finish: ${end:-no end marker}"
    fi
    # Anything the kernel said during the walk is worth seeing.
    show_log "$data"
}

[ $# -eq 1 ] || usage
check_tools
mkdir -p "$cache" || fail 1 "cannot create $cache (set FOLIOFS_ORACLE_CACHE)"
case $1 in
--prepare) prepare ;;
-*) usage ;;
*) run "$1" ;;
esac
