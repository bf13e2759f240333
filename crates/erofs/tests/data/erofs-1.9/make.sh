#!/usr/bin/env bash
# Rebuilds corpus.tar.xz beside this script: one EROFS image per layout
# mkfs.erofs 1.9.3 writes, each with a manifest of what it must read as.
#
#   bash crates/erofs/tests/data/erofs-1.9/make.sh [EROFS-UTILS-BIN-DIR]
#
# Needs root (device nodes, owners, trusted.* xattrs, mount), the kernel's
# EROFS driver (Linux 6.18 mounts every image here), erofs-utils 1.9.3
# (mkfs.erofs; the directory defaults to /var/cache/erofs-utils-1.9.3/bin,
# else mkfs.erofs on PATH), losetup, getfattr/setfattr, perl, GNU tar, xz.
#
# Steps: a small deterministic source tree (every entry type; whole-second
# mtimes but one); a pax tar of it (for --tar images); one image per line of
# IMAGES below with fixed -T and -U; each image mounted by the kernel and
# walked; the walk checked against the source tree's own walk, where only
# the differences listed below are allowed; the walk written as
# NAME.manifest. Then small fuzz seeds (seeds/). The images, manifests, the
# tar (the device of tar_i), the blob (the device of chunk_blob) and the
# seeds are packed into corpus.tar.xz.
#
# Manifest lines, tab-separated:
#   image  NAME.erofs
#   mkfs   the command line that built it (run in the unpacked directory)
#   device FILE                 (extra device 1, when the image has one)
#   note   TEXT                 (where the expected value is not what the
#                                kernel showed, or the tree lost something)
#   entry  PATH KIND MODE UID GID NLINK SIZE MTIME INO RDEV SHA256 TARGET
#          (MODE octal with the type bits; MTIME SEC.NSEC; INO the kernel's
#          st_ino, the nid; RDEV MAJOR:MINOR; SHA256 of a regular file's
#          data and TARGET a symlink's target in hex, else "-")
#   xattr  PATH NAME VALUE      (VALUE in hex, "-" when empty)
# Paths start at "/"; entries are sorted by path, xattrs by path and name.
#
# Differences from the source tree the manifest records (and expects):
# - sockets do not survive tar, so the --tar images lack /sock;
# - 48-bit images keep one nanosecond value for compact inodes, so a file
#   whose mtime has nanoseconds may read with the image's;
# - Linux 6.18 loses shared xattrs of the inodes in a metabox's first block;
#   the manifest holds the source tree's xattrs there (the correct value).
#
# A second run gives the same archive but for some 48-bit compressed images:
# mkfs.erofs 1.9.3 leaves 8 bytes of a heap address in their compression
# metadata (the kernel and foliofs read past them; the walks are the same).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
bin=${1:-/var/cache/erofs-utils-1.9.3/bin}
if [ ! -x "$bin/mkfs.erofs" ]; then
    bin=$(dirname "$(command -v mkfs.erofs)")
fi
mkfs=$bin/mkfs.erofs
"$mkfs" --version 2>&1 | grep -q '1\.9\.3' ||
    { echo "make.sh: needs mkfs.erofs 1.9.3, $mkfs is $("$mkfs" --version 2>&1 | head -1)" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "make.sh: run as root" >&2; exit 1; }
for tool in losetup getfattr setfattr perl tar xz; do
    command -v "$tool" >/dev/null || { echo "make.sh: needs $tool" >&2; exit 1; }
done

export LC_ALL=C
umask 022
work=$(mktemp -d "${TMPDIR:-/tmp}/erofs-corpus.XXXXXX")
mnt=$work/mnt
loops=()
cleanup() {
    mountpoint -q "$mnt" 2>/dev/null && umount "$mnt"
    for l in "${loops[@]}"; do losetup -d "$l" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$mnt"

# --- the source tree --------------------------------------------------------

# Word soup from 64 made-up words: compresses, but not to nothing.
soup() {
    perl -e 'srand($ARGV[1]);
        my @w = map { join "", map { chr(97 + int rand 16) } 1 .. 2 + int rand 8 } 1 .. 64;
        my $s = ""; $s .= $w[int rand @w] . (rand() < 0.9 ? " " : "\n") while length $s < $ARGV[0];
        print substr($s, 0, $ARGV[0])' "$1" "$2"
}
# Numbered copies of one 4000-byte paragraph: compresses to almost nothing,
# so large files stay cheap in the archive whatever the algorithm.
prose() {
    perl -e 'srand($ARGV[1]);
        my @w = map { join "", map { chr(97 + int rand 16) } 1 .. 2 + int rand 8 } 1 .. 64;
        my $p = ""; $p .= $w[int rand @w] . " " while length $p < 4000; $p = substr($p, 0, 4000);
        my $s = ""; my $n = 0; $s .= sprintf("%07d %s\n", $n++, $p) while length $s < $ARGV[0];
        print substr($s, 0, $ARGV[0])' "$1" "$2"
}
# Bytes no algorithm compresses.
noise() {
    perl -e 'srand($ARGV[1]); print pack "C*", map { int rand 256 } 1 .. $ARGV[0]' "$1" "$2"
}
# A POSIX ACL xattr value (version 2): TAG:PERM[:ID] ... (tags as numbers).
acl() {
    local hex=0x02000000 e tag perm id
    for e in "$@"; do
        IFS=: read -r tag perm id <<<"$e"
        hex+=$(printf '%02x00%02x00' "$tag" "$perm")
        if [ -n "$id" ]; then
            hex+=$(printf '%08x' "$id" | sed 's/\(..\)\(..\)\(..\)\(..\)/\4\3\2\1/')
        else
            hex+=ffffffff
        fi
    done
    printf '%s' "$hex"
}

make_tree() {
    local t=$1
    mkdir -p "$t"/dir/sub/deeper "$t"/empty "$t"/many
    cd "$t"
    : >empty_file
    printf x >one
    printf 'hello world\n' >small.txt
    for s in 100 4095 4096 4097; do soup "$s" "$s" >"text_$s"; done
    prose 70000 70000 >text_70000
    prose 1048576 1 >prose_1m
    noise 5000 5000 >rand_5000
    noise 65536 65536 >rand_65536
    noise 300000 300000 >rand_300000
    { prose 60000 7; noise 20000 8; prose 60000 9; } >mixed_140k
    soup 8192 42 >"$work/blk"
    cp "$work/blk" dup_a
    cat "$work/blk" "$work/blk" >dup_b
    { soup 1000 43; cat "$work/blk"; } >dup_c
    head -c 262144 /dev/zero >zeros_256k
    soup 3000 11 >dir/sub/deeper/nested.txt
    for i in $(seq 1 300); do
        printf 'entry %d\n' "$i" >"many/entry_with_a_longish_name_$(printf %04d "$i")"
    done
    ln -s small.txt link_rel
    ln -s /nonexistent/target/path link_abs
    ln -s dir link_dir
    ln -s "$(printf 'a/%.0s' $(seq 900))end" link_long
    ln one hardlink_one
    ln small.txt dir/hardlink_small
    mkfifo -m 0640 fifo
    mknod chardev c 1 3
    mknod blockdev b 7 0
    mknod bigdev c 259 70000
    perl -MSocket -e 'socket(my $s, PF_UNIX, SOCK_STREAM, 0) or die; bind($s, pack_sockaddr_un("sock")) or die'

    chown 1000:100 one
    chown 65534:65534 text_100
    chown 123456:654321 small.txt
    chown -h 7:8 link_rel
    chmod 4755 one
    chmod 2711 text_100
    chmod 1777 empty
    chmod 0600 rand_5000

    setfattr -n user.foo -v bar small.txt
    setfattr -n user.empty one
    setfattr -n user.big -v "$(printf 'v%.0s' $(seq 3000))" text_100
    for f in one small.txt text_100 dir many/entry_with_a_longish_name_0300; do
        setfattr -n user.shared -v same-value "$f"
    done
    for i in 1 2 3 4 5; do
        setfattr -n "user.com.example.project.attribute.number$i" -v "val$i" dir/sub
    done
    for i in 1 2 3; do setfattr -n "trusted.overlay.opaque$i" -v y dir/sub/deeper; done
    setfattr -n trusted.overlay.origin -v z dir
    setfattr -h -n trusted.sym -v on-a-symlink link_dir
    setfattr -n security.selinux -v system_u:object_r:etc_t:s0 small.txt
    # user::rw- user:1000:rw- group::r-- group:100:r-- mask::rw- other::r--
    setfattr -n system.posix_acl_access -v "$(acl 1:6 2:6:1000 4:4 8:4:100 16:6 32:4)" small.txt
    setfattr -n system.posix_acl_access -v "$(acl 1:7 2:4:2000 4:5 16:5 32:5)" dir
    setfattr -n system.posix_acl_default -v "$(acl 1:7 2:7:1000 4:5 16:7 32:5)" dir

    # Whole seconds, one per entry, deepest first so a directory's own
    # mtime is set after its children; then the special cases.
    local n=0 p
    while IFS= read -r -d '' p; do
        touch -h -d "@$((1700000000 + n * 37))" "$p"
        n=$((n + 1))
    done < <(find . -depth -print0 | sort -z -r)
    touch -h -d @1 one
    touch -h -d @4102444799 small.txt
    touch -h -d @1700000123.123456789 text_4097
    cd - >/dev/null
}

# --- walking a tree --------------------------------------------------------

# The manifest's entry and xattr lines for the tree at $1.
walk() {
    local root=$1 t
    t=$(mktemp -d "$work/walk.XXXXXX")
    (
        cd "$root"
        find . -print0 >"$t/all"
        xargs -0 stat -c '%n	%f	%u	%g	%h	%s	%.9Y	%i	%Hr:%Lr' <"$t/all" >"$t/stat"
        find . -type f -print0 | xargs -0 -r sha256sum | sed 's/^\([0-9a-f]*\)  /\1\t/' >"$t/sha"
        find . -type l -print0 | while IFS= read -r -d '' p; do
            printf '%s\t%s\n' "$p" "$(readlink -n "$p" | od -An -v -tx1 | tr -d ' \n')"
        done >"$t/target"
        getfattr -R -P -h -d -m - -e hex . 2>/dev/null >"$t/xattr" || true
    )
    awk -F'\t' -v OFS='\t' '
        function rel(p) { sub(/^\.\/?/, "", p); return "/" p }
        FILENAME ~ /sha$/ { sha[rel($2)] = $1; next }
        FILENAME ~ /target$/ { tgt[rel($1)] = $2; next }
        FILENAME ~ /stat$/ {
            m = 0; h = $2
            for (i = 1; i <= length(h); i++) m = m * 16 + index("0123456789abcdef", substr(h, i, 1)) - 1
            ty = int(m / 4096)
            kind = ty == 8 ? "reg" : ty == 4 ? "dir" : ty == 10 ? "lnk" : ty == 1 ? "fifo" : \
                   ty == 2 ? "chr" : ty == 6 ? "blk" : ty == 12 ? "sock" : "unknown"
            p = rel($1)
            print "entry", p, kind, sprintf("%o", m), $3, $4, $5, $6, $7, $8, $9, \
                (p in sha ? sha[p] : "-"), (p in tgt ? tgt[p] : "-")
        }' "$t/sha" "$t/target" "$t/stat"
    awk -v OFS='\t' '
        /^# file: / { p = substr($0, 9); sub(/^\.\/?/, "", p); p = "/" p; next }
        /^$/ { next }
        {
            i = index($0, "="); name = i ? substr($0, 1, i - 1) : $0; v = i ? substr($0, i + 1) : ""
            sub(/^0x/, "", v); if (v == "" || v == "\"\"") v = "-"
            print "xattr", p, name, v
        }' "$t/xattr"
    rm -rf "$t"
}

# Entry lines with what a different file system may rightly number or size
# differently blanked: the inode number, and a directory's size.
masked() {
    awk -F'\t' -v OFS='\t' '$1 == "entry" { $10 = "-"; if ($3 == "dir") $8 = "-" } { print }' "$1" | sort
}

# --- the images ------------------------------------------------------------

# NAME|SOURCE|ARGS: SOURCE is tree or tar; ARGS are split on spaces.
IMAGES='
plain|tree|
lz4|tree|-zlz4
lz4hc_tail|tree|-zlz4hc -Eztailpacking
lz4hc_C64k|tree|-zlz4hc -C65536
lzma|tree|-zlzma
lzma_C64k|tree|-zlzma -C65536
deflate|tree|-zdeflate
zstd|tree|-zzstd
zstd_C64k|tree|-zzstd -C65536
mixed_cfgs|tree|-zlz4:lzma:deflate:zstd
lz4_frag_dedupe|tree|-zlz4 -Efragments,dedupe
lz4_allfrag|tree|-zlz4 -Eall-fragments
lz4hc_fragdedupe_full|tree|-zlz4hc -C16384 -Eall-fragments,fragdedupe=full
lz4hc_dedupe|tree|-zlz4hc -C16384 -Ededupe
lzma_allfrag_1m|tree|-zlzma,6 -Eall-fragments,fragdedupe=inode -C1048576
zD|tree|-zlz4 --zD
zD_MZ|tree|-zlz4 --zD --MZ
MZ|tree|--MZ
b512|tree|-b512
b1024|tree|-b1024
b2048|tree|-b2048
lz4_b1024|tree|-zlz4 -b1024
xattr_prefix|tree|--xattr-prefix=user.com.example.project. --xattr-prefix=trusted.overlay.
xattr_prefix_frag|tree|-zlz4 -Efragments --xattr-prefix=user.com.example.project. --xattr-prefix=trusted.overlay.
no_xattr_filter|tree|-E^xattr-name-filter
tar_f|tar|--tar=f
tar_f_lz4hc_tail|tar|--tar=f -zlz4hc -Eztailpacking
tar_i|tar|--tar=i
chunk_16k|tree|--chunksize=16384
chunk_blob|tree|--chunksize=8192 --blobdev=chunk_blob.blob
48bit|tree|-E48bit
48bit_lz4|tree|-zlz4 -E48bit
48bit_zstd|tree|-zzstd -E48bit
48bit_zstd_frag|tree|-zzstd -C65536 -E48bit,fragments,dedupe
dot_omitted|tree|-Edot-omitted
chunk_48bit|tree|--chunksize=8192 -E48bit,force-chunk-indexes
metabox|tree|-zlz4 -m4096
metabox_lzma|tree|-zlzma -C65536 -m4096 -Eall-fragments
metabox_mixed|tree|-zlz4 -m4096:zstd
'

make_tree "$work/tree"
# Sorted, numeric owners, no atime/ctime records: the same tree gives the
# same tar. Sockets cannot be archived (tar says so; that is expected).
tar -C "$work/tree" --create --file "$work/tree.tar" --format=pax --sort=name \
    --numeric-owner --xattrs --xattrs-include='*' --acls \
    --pax-option='exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime' . 2>/dev/null || true
tar -tf "$work/tree.tar" >/dev/null
walk "$work/tree" >"$work/source.walk"

built=0
while IFS='|' read -r name src args; do
    [ -n "$name" ] || continue
    cd "$work"
    rm -f "$name.erofs" "$name.blob"
    # shellcheck disable=SC2206
    argv=($args)
    if [ "$src" = tar ]; then input=tree.tar; else input=tree; fi
    cmd=(mkfs.erofs --quiet -T1700000000 --mkfs-time -U 11111111-2222-3333-4444-555555555555
        "${argv[@]}" "$name.erofs" "$input")
    "$bin/${cmd[0]}" "${cmd[@]:1}" || { echo "make.sh: $name: ${cmd[*]} failed" >&2; exit 1; }
    device=
    case "$args" in
    *--tar=i*) device=tree.tar ;;
    *--blobdev=*) device=$name.blob ;;
    esac

    opts=ro
    if [ -n "$device" ]; then
        # mount(8) puts the image on a loop device; beside a block device
        # the kernel takes the extra device only as a block device too.
        loop=$(losetup --find --show --read-only "$work/$device")
        loops+=("$loop")
        opts+=",device=$loop"
    fi
    mount -t erofs -o "$opts" "$work/$name.erofs" "$mnt"
    walk "$mnt" >"$work/kernel.walk"
    umount "$mnt"
    if [ -n "$device" ]; then
        losetup -d "${loops[-1]}"
        unset 'loops[-1]'
    fi

    # What the image should read as: the source tree, less what the image
    # cannot carry. Every other difference from the kernel's walk stops here.
    notes=()
    want=$work/source.walk
    if [ "$src" = tar ]; then
        awk -F'\t' '!(($1 == "entry" && $3 == "sock") || ($2 == "/sock"))' "$want" >"$work/want.walk"
        want=$work/want.walk
        notes+=("sockets do not survive tar: /sock is not in the image")
    fi
    final=$work/kernel.walk
    if [[ " $args " == *" -m"* ]]; then
        # Expect the source tree's xattrs; say where the kernel differs.
        { diff <(grep '^xattr' "$want" | sort) <(grep '^xattr' "$work/kernel.walk" | sort) || true; } |
            awk -F'\t' '/^< / { print "the source tree has " $3 " on " $2 "; Linux 6.18 does not show it (shared xattr of an inode in the metabox'"'"'s first block)" }
                        /^> / { print "Linux 6.18 shows " $3 " on " $2 ", which the source tree lacks" }' >"$work/xnotes"
        while IFS= read -r l; do notes+=("$l"); done <"$work/xnotes"
        { grep -v '^xattr' "$work/kernel.walk"; grep '^xattr' "$want"; } >"$work/final.walk"
        final=$work/final.walk
    fi
    if ! diff <(masked "$want") <(masked "$final") >"$work/diff"; then
        # 48-bit images: compact inodes share one nanosecond value.
        if [[ "$args" == *48bit* || "$args" == *dot-omitted* || " $args " == *" -m"* ]] &&
            ! grep -v '^[<>] entry' "$work/diff" | grep -q '^[<>]'; then
            paste <(grep '^<' "$work/diff") <(grep '^>' "$work/diff") |
                awk -F'\t' '{ split($9, a, "."); split($22, b, ".");
                    same = a[1] == b[1]; for (i = 2; i <= 13; i++) if (i != 9 && $i != $(i + 13)) same = 0
                    if (!same) exit 1
                    print $2 ": mtime " $9 " in the tree, " $22 " in the image (48-bit images keep one nanosecond value for compact inodes)" }' \
                    >"$work/tnotes" || { echo "make.sh: $name differs from the source tree:" >&2; cat "$work/diff" >&2; exit 1; }
            while IFS= read -r l; do notes+=("$l"); done <"$work/tnotes"
        else
            echo "make.sh: $name differs from the source tree:" >&2
            cat "$work/diff" >&2
            exit 1
        fi
    fi
    {
        printf 'image\t%s\n' "$name.erofs"
        printf 'mkfs\t%s\n' "${cmd[*]}"
        [ -z "$device" ] || printf 'device\t%s\n' "$device"
        for l in "${notes[@]}"; do printf 'note\t%s\n' "$l"; done
        grep '^entry' "$final" | sort -t'	' -k2,2
        grep '^xattr' "$final" | sort -t'	' -k2,2 -k3,3
    } >"$name.manifest"
    built=$((built + 1))
    echo "make.sh: $name: $(stat -c %s "$name.erofs") bytes, ${#notes[@]} note(s)" >&2
done <<<"$IMAGES"

# --- fuzz seeds --------------------------------------------------------------

# The layouts the fuzzer cannot reach from Debian's mkfs.erofs, from a tiny
# tree, each within the fuzzer's 32 KiB input limit (scripts/fuzz-erofs
# starts from them). No manifest: the kernel's walk must equal the tree's.
SEEDS='
lzma|-zlzma -C16384
deflate|-zdeflate
zstd|-zzstd
mixed_cfgs|-zlz4:lzma:deflate:zstd
lz4_allfrag|-zlz4 -Eall-fragments
lzma_frag_dedupe|-zlzma -C8192 -Efragments,dedupe
lz4hc_dedupe|-zlz4hc -C8192 -Ededupe
zD|-zlz4 --zD
'
mkdir -p "$work/seedtree/d" "$work/seeds"
(
    cd "$work/seedtree"
    soup 6000 1 >a
    { soup 2000 2; head -c 5000 a; } >b
    prose 20000 3 >c
    for i in $(seq 1 30); do printf '%d\n' "$i" >"d/file_$i"; done
    ln -s a link
    setfattr -n user.x -v seed a
)
walk "$work/seedtree" >"$work/seedtree.walk"
while IFS='|' read -r name args; do
    [ -n "$name" ] || continue
    cd "$work"
    # shellcheck disable=SC2206
    argv=($args)
    "$mkfs" --quiet -T1700000000 --mkfs-time -U 11111111-2222-3333-4444-555555555555 \
        "${argv[@]}" "seeds/$name.erofs" seedtree
    size=$(stat -c %s "seeds/$name.erofs")
    [ "$size" -le 32768 ] || { echo "make.sh: seed $name is $size bytes" >&2; exit 1; }
    mount -t erofs -o ro "seeds/$name.erofs" "$mnt"
    walk "$mnt" >"$work/kernel.walk"
    umount "$mnt"
    diff <(masked "$work/seedtree.walk") <(masked "$work/kernel.walk") ||
        { echo "make.sh: seed $name differs from its tree" >&2; exit 1; }
    echo "make.sh: seed $name: $size bytes" >&2
done <<<"$SEEDS"

cd "$work"
tar --create --sort=name --owner=0 --group=0 --numeric-owner --mtime=@1700000000 \
    --format=gnu ./*.erofs ./*.manifest ./*.blob tree.tar seeds | xz -9e -T1 >"$here/corpus.tar.xz"
echo "make.sh: $built images, $(stat -c %s "$here/corpus.tar.xz") bytes in $here/corpus.tar.xz" >&2
