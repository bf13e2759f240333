"""A workload for a ramfs whose server is killed under it.

Runs random operations one after another (creates, writes at offsets,
appends, truncates, renames over files and of directories, unlinks,
mkdir, rmdir, symlinks, hard links, xattrs, chmod), keeping a model of
what every operation that returned left; writes through a descriptor
held open from the start and through a shared mapping; commits rows to
SQLite in WAL mode; extracts tar archives (`tar x`); commits to a git
repository; holds an fcntl lock. It never sees a kill: an
operation the dead server was answering is answered by the next one.

Any error, any file that reads otherwise than the model says, is a
failure: an acknowledged operation lost shows as a difference, and one
applied twice as an error (EEXIST, ENOENT) or a difference. At the end
the whole tree is compared with the model, with the file system's
invariants (inode and block counts against statfs, link counts).

usage: survive_workload.py MOUNT STOPFILE REPORT SEED
Writes READY beside STOPFILE once it runs; stops when STOPFILE appears.
"""

import errno
import fcntl
import io
import json
import mmap
import os
import random
import shutil
import sqlite3
import stat
import subprocess
import sys
import tarfile
import time

root, stopfile, report, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
rnd = random.Random(seed)
SPECIAL = "_special"


class Inode:
    __slots__ = ("data", "mode", "xattrs")

    def __init__(self, data=b""):
        self.data = bytearray(data)
        self.mode = 0o644
        self.xattrs = {}


# relative path -> ("d", None) | ("f", Inode) | ("l", target)
tree = {}
dirs = [""]
slow = []
ops = 0
counts = {}


class Failed(Exception):
    pass


def P(rel):
    return os.path.join(root, rel)


def timed(name, fn):
    global ops
    t0 = time.monotonic()
    try:
        r = fn()
    except OSError as e:
        raise Failed(f"{name}: {e}") from e
    t1 = time.monotonic()
    if t1 - t0 > 0.002:
        slow.append((t0, t1))
    ops += 1
    counts[name] = counts.get(name, 0) + 1
    return r


def write_all(fd, data, off=None):
    done = 0
    while done < len(data):
        if off is None:
            n = os.write(fd, data[done:])
        else:
            n = os.pwrite(fd, data[done:], off + done)
        if n <= 0:
            raise OSError(errno.EIO, "short write")
        done += n


def read_all(path):
    with open(path, "rb") as f:
        return f.read()


def new_name():
    return "n%x" % rnd.randrange(1 << 40)


def files():
    return [p for p, (k, _) in tree.items() if k == "f"]


def set_range(buf, off, data):
    if len(buf) < off:
        buf.extend(bytes(off - len(buf)))
    buf[off : off + len(data)] = data


def op_create():
    p = os.path.join(rnd.choice(dirs), new_name())
    data = rnd.randbytes(rnd.choice([0, 1, 100, 4096, 5000, 70000]))

    def f():
        fd = os.open(P(p), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        try:
            write_all(fd, data)
        finally:
            os.close(fd)

    timed("create", f)
    tree[p] = ("f", Inode(data))


def op_pwrite():
    fs = files()
    if not fs:
        return
    p = rnd.choice(fs)
    ino = tree[p][1]
    off = rnd.randrange(0, 300_000)
    data = rnd.randbytes(rnd.randrange(1, 20_000))

    def f():
        fd = os.open(P(p), os.O_WRONLY)
        try:
            write_all(fd, data, off)
        finally:
            os.close(fd)

    timed("pwrite", f)
    set_range(ino.data, off, data)


def op_append():
    fs = files()
    if not fs:
        return
    p = rnd.choice(fs)
    ino = tree[p][1]
    data = rnd.randbytes(rnd.randrange(1, 9000))

    def f():
        fd = os.open(P(p), os.O_WRONLY | os.O_APPEND)
        try:
            write_all(fd, data)
        finally:
            os.close(fd)

    timed("append", f)
    ino.data.extend(data)


def op_truncate():
    fs = files()
    if not fs:
        return
    p = rnd.choice(fs)
    ino = tree[p][1]
    size = rnd.randrange(0, 200_000)
    timed("truncate", lambda: os.truncate(P(p), size))
    if size < len(ino.data):
        del ino.data[size:]
    else:
        ino.data.extend(bytes(size - len(ino.data)))


def op_verify():
    fs = files()
    if not fs:
        return
    p = rnd.choice(fs)
    got = timed("read", lambda: read_all(P(p)))
    if got != bytes(tree[p][1].data):
        raise Failed(f"read {p}: {len(got)} bytes differ from the {len(tree[p][1].data)} written")


def op_unlink():
    ps = [p for p, (k, _) in tree.items() if k in "fl"]
    if not ps:
        return
    p = rnd.choice(ps)
    timed("unlink", lambda: os.unlink(P(p)))
    del tree[p]


def op_rename_file():
    fs = files()
    if not fs:
        return
    src = rnd.choice(fs)
    if len(fs) > 1 and rnd.random() < 0.4:
        dst = rnd.choice([f for f in fs if f != src])
    else:
        dst = os.path.join(rnd.choice(dirs), new_name())
    timed("rename", lambda: os.rename(P(src), P(dst)))
    if dst in tree and tree[dst][1] is tree[src][1]:
        return  # hard links of one file: rename does nothing
    tree[dst] = tree.pop(src)


def op_mkdir():
    parents = [d for d in dirs if d.count("/") < 3]
    p = os.path.join(rnd.choice(parents), new_name())
    timed("mkdir", lambda: os.mkdir(P(p), 0o755))
    tree[p] = ("d", None)
    dirs.append(p)


def children(d):
    pre = d + "/"
    return [p for p in tree if p.startswith(pre)]


def op_rmdir():
    empty = [d for d in dirs if d and not children(d)]
    if not empty:
        return
    d = rnd.choice(empty)
    timed("rmdir", lambda: os.rmdir(P(d)))
    del tree[d]
    dirs.remove(d)


def op_rename_dir():
    ds = [d for d in dirs if d]
    if not ds:
        return
    d = rnd.choice(ds)
    new = os.path.join(os.path.dirname(d), new_name())
    timed("rename_dir", lambda: os.rename(P(d), P(new)))
    moved = {}
    for p in [d] + children(d):
        moved[new + p[len(d) :]] = tree.pop(p)
    tree.update(moved)
    dirs[:] = [new + x[len(d) :] if x == d or x.startswith(d + "/") else x for x in dirs]


def op_symlink():
    p = os.path.join(rnd.choice(dirs), new_name())
    target = "../" + new_name()
    timed("symlink", lambda: os.symlink(target, P(p)))
    tree[p] = ("l", target)


def op_link():
    fs = files()
    if not fs:
        return
    src = rnd.choice(fs)
    dst = os.path.join(rnd.choice(dirs), new_name())
    timed("link", lambda: os.link(P(src), P(dst)))
    tree[dst] = tree[src]


def op_setxattr():
    fs = files()
    if not fs:
        return
    p = rnd.choice(fs)
    k = "user.k%d" % rnd.randrange(4)
    v = rnd.randbytes(rnd.randrange(0, 64))
    timed("setxattr", lambda: os.setxattr(P(p), k, v))
    tree[p][1].xattrs[k] = v


def op_removexattr():
    fs = [p for p in files() if tree[p][1].xattrs]
    if not fs:
        return
    p = rnd.choice(fs)
    k = rnd.choice(list(tree[p][1].xattrs))
    timed("removexattr", lambda: os.removexattr(P(p), k))
    del tree[p][1].xattrs[k]


def op_chmod():
    fs = files()
    if not fs:
        return
    p = rnd.choice(fs)
    mode = rnd.choice([0o600, 0o644, 0o640, 0o755, 0o700])
    timed("chmod", lambda: os.chmod(P(p), mode))
    tree[p][1].mode = mode


def op_untar():
    """A small archive extracted into a new directory (`tar x`): its
    files, directories and symlinks enter the model as the archive has
    them."""
    top = os.path.join(rnd.choice([d for d in dirs if d.count("/") < 2]), new_name())
    buf = io.BytesIO()
    members = []
    with tarfile.open(fileobj=buf, mode="w") as t:
        for i in range(rnd.randrange(3, 12)):
            name = "sub/f%d" % i if i % 3 else "f%d" % i
            data = rnd.randbytes(rnd.choice([0, 10, 4096, 9000]))
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o640
            t.addfile(info, io.BytesIO(data))
            members.append((name, data))
        link = tarfile.TarInfo("ln")
        link.type = tarfile.SYMTYPE
        link.linkname = "f0"
        t.addfile(link)
    buf.seek(0)

    def f():
        with tarfile.open(fileobj=buf) as t:
            t.extractall(P(top))

    timed("untar", f)
    for d in [top, os.path.join(top, "sub")]:
        tree[d] = ("d", None)
        dirs.append(d)
    for name, data in members:
        ino = Inode(data)
        ino.mode = 0o640
        tree[os.path.join(top, name)] = ("f", ino)
    tree[os.path.join(top, "ln")] = ("l", "f0")


GIT = shutil.which("git")
GIT_ENV = dict(os.environ, GIT_CONFIG_GLOBAL="/dev/null", GIT_CONFIG_SYSTEM="/dev/null",
               GIT_AUTHOR_NAME="w", GIT_AUTHOR_EMAIL="w@x", GIT_COMMITTER_NAME="w",
               GIT_COMMITTER_EMAIL="w@x", HOME="/nonexistent")


def git(*args):
    r = subprocess.run([GIT, "-C", os.path.join(root, SPECIAL, "repo"), *args],
                       env=GIT_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if r.returncode != 0:
        raise Failed("git %s: %s" % (" ".join(args), r.stderr.decode(errors="replace").strip()))
    return r.stdout.decode()


OPS = [
    (op_create, 12),
    (op_pwrite, 10),
    (op_append, 6),
    (op_truncate, 3),
    (op_verify, 6),
    (op_unlink, 8),
    (op_rename_file, 5),
    (op_mkdir, 3),
    (op_rmdir, 2),
    (op_rename_dir, 1),
    (op_symlink, 2),
    (op_link, 2),
    (op_setxattr, 3),
    (op_removexattr, 1),
    (op_chmod, 2),
    (op_untar, 1),
]
CHOICES = [f for f, w in OPS for _ in range(w)]


def check_tree(fail):
    """The tree against the model; the statfs invariants."""
    seen = {}
    inodes = {}  # st_ino -> (kind, names, st)
    for dirpath, dnames, fnames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        rel = "" if rel == "." else rel
        st = os.lstat(dirpath)
        inodes.setdefault(st.st_ino, ["d", 0, st])[1] += 1
        for n in dnames + fnames:
            p = os.path.join(rel, n)
            st = os.lstat(P(p))
            kind = "d" if stat.S_ISDIR(st.st_mode) else "l" if stat.S_ISLNK(st.st_mode) else "f"
            if kind != "d":
                inodes.setdefault(st.st_ino, [kind, 0, st])[1] += 1
            if p == SPECIAL or p.startswith(SPECIAL + "/"):
                continue
            seen[p] = (kind, st)
    for p in sorted(set(seen) | set(tree)):
        if p not in seen:
            fail(f"{p}: lost")
            continue
        if p not in tree:
            fail(f"{p}: there, but never made (or made twice)")
            continue
        kind, st = seen[p]
        want_kind, what = tree[p]
        if kind != want_kind:
            fail(f"{p}: a {kind}, made a {want_kind}")
            continue
        if kind == "l":
            if os.readlink(P(p)) != what:
                fail(f"{p}: the link's target differs")
        elif kind == "f":
            data = read_all(P(p))
            if data != bytes(what.data):
                fail(f"{p}: {len(data)} bytes, {len(what.data)} written, or different")
            if stat.S_IMODE(st.st_mode) != what.mode:
                fail(f"{p}: mode {oct(st.st_mode)}, set {oct(what.mode)}")
            x = {k: os.getxattr(P(p), k) for k in os.listxattr(P(p)) if k.startswith("user.")}
            if x != what.xattrs:
                fail(f"{p}: xattrs {sorted(x)}, set {sorted(what.xattrs)}")
            names = sum(1 for q, (k, o) in tree.items() if o is what)
            if p.startswith(SPECIAL):
                pass
            elif st.st_nlink != names:
                fail(f"{p}: {st.st_nlink} links, made {names}")
    # Inodes in use and blocks in use, as statfs counts them: every
    # directory one inode, every other inode one per name; every file's
    # blocks.
    sv = os.statvfs(root)
    used_inodes = sum(1 if k == "d" else n for k, n, _ in inodes.values())
    if sv.f_files - sv.f_ffree != used_inodes:
        fail(f"statfs: {sv.f_files - sv.f_ffree} inodes in use, the tree has {used_inodes}")
    used = sum(st.st_blocks * 512 for k, _, st in inodes.values() if k == "f")
    if (sv.f_blocks - sv.f_bfree) * sv.f_frsize != used:
        fail(f"statfs: {(sv.f_blocks - sv.f_bfree) * sv.f_frsize} bytes in use, the files' st_blocks say {used}")


def main():
    out = {"ops": 0, "errors": [], "mismatches": [], "slow": [], "counts": {}}
    special = P(SPECIAL)
    os.mkdir(special)
    held_model = bytearray()
    held = os.open(os.path.join(special, "held"), os.O_CREAT | os.O_RDWR, 0o644)
    fcntl.lockf(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    mapped_model = bytearray(1 << 20)
    mfd = os.open(os.path.join(special, "mapped"), os.O_CREAT | os.O_RDWR, 0o644)
    os.ftruncate(mfd, len(mapped_model))
    mm = mmap.mmap(mfd, len(mapped_model))
    db = sqlite3.connect(os.path.join(special, "db.sqlite"), isolation_level=None)
    db.execute("pragma journal_mode=wal")
    db.execute("create table t (i integer primary key, v blob)")
    rows = 0
    commits = 0
    if GIT:
        os.mkdir(os.path.join(special, "repo"))
        git("init", "-q")
    ready = os.path.join(os.path.dirname(stopfile), "READY")
    with open(ready, "w") as f:
        f.write("ready\n")
    n = 0
    try:
        while not os.path.exists(stopfile):
            n += 1
            if len(tree) > 400:
                op_unlink() if rnd.random() < 0.7 else op_rmdir()
            else:
                rnd.choice(CHOICES)()
            if n % 17 == 0:
                data = rnd.randbytes(rnd.randrange(1, 3000))
                off = len(held_model) if rnd.random() < 0.7 else rnd.randrange(0, len(held_model) + 1)
                timed("held_write", lambda: write_all(held, data, off))
                set_range(held_model, off, data)
            if n % 23 == 0:
                off = rnd.randrange(0, len(mapped_model) - 5000)
                data = rnd.randbytes(rnd.randrange(1, 5000))
                mm[off : off + len(data)] = data
                timed("msync", lambda: mm.flush())
                mapped_model[off : off + len(data)] = data
            if GIT and n % 401 == 0:
                name = "c%d" % commits
                with open(os.path.join(special, "repo", name), "wb") as f:
                    f.write(rnd.randbytes(rnd.randrange(1, 3000)))
                timed("git", lambda: (git("add", name), git("commit", "-q", "-m", name)))
                commits += 1
            if n % 13 == 0:
                v = rnd.randbytes(rnd.randrange(1, 2000))

                def commit():
                    db.execute("begin")
                    db.execute("insert into t (v) values (?)", (v,))
                    db.execute("commit")

                try:
                    timed("sqlite", commit)
                except sqlite3.Error as e:
                    raise Failed(f"sqlite commit: {e}") from e
                rows += 1
        # The lock taken at the start still holds (checked first: closing
        # any descriptor of the file would drop it).
        pid = os.fork()
        if pid == 0:
            fd3 = os.open(os.path.join(special, "held"), os.O_RDWR)
            try:
                fcntl.lockf(fd3, fcntl.LOCK_EX | fcntl.LOCK_NB)
                os._exit(1)
            except OSError:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        out["lock_held"] = os.WEXITSTATUS(status) == 0
        # Everything again, through the descriptors held all along.
        if os.pread(held, len(held_model) + 10, 0) != bytes(held_model):
            out["mismatches"].append("the descriptor held open reads otherwise than written")
        if read_all(os.path.join(special, "held")) != bytes(held_model):
            out["mismatches"].append("the file written through a held descriptor differs")
        if mm[:] != bytes(mapped_model):
            out["mismatches"].append("the shared mapping differs from what was written to it")
        mm.close()
        os.close(mfd)
        fd2 = os.open(os.path.join(special, "mapped"), os.O_RDONLY)
        if os.pread(fd2, len(mapped_model), 0) != bytes(mapped_model):
            out["mismatches"].append("the mapped file reads otherwise than its mapping was written")
        os.close(fd2)
        got = db.execute("select count(*) from t").fetchone()[0]
        if got != rows:
            out["mismatches"].append(f"sqlite: {got} rows, {rows} committed")
        ok = db.execute("pragma integrity_check").fetchone()[0]
        if ok != "ok":
            out["mismatches"].append(f"sqlite integrity_check: {ok}")
        db.close()
        if GIT:
            logged = int(git("rev-list", "--count", "HEAD").strip() or 0) if commits else 0
            if logged != commits:
                out["mismatches"].append(f"git: {logged} commits, {commits} made")
            try:
                git("fsck", "--strict", "--no-progress")
            except Failed as e:
                out["mismatches"].append(str(e))
        os.close(held)
        check_tree(out["mismatches"].append)
    except Failed as e:
        out["errors"].append(str(e))
    out["ops"] = ops
    out["counts"] = counts
    out["slow"] = slow
    out["sqlite_rows"] = rows
    out["git_commits"] = commits if GIT else None
    out["files"] = len(files())
    with open(report, "w") as f:
        json.dump(out, f)


main()
