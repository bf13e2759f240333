//! The writers that are libraries rather than tools: a Go program on
//! `archive/tar` as image tools write layers, and Python's `tarfile`.

/// `go run prog.go SRC OUT`: a PAX tar of SRC's contents as container
/// image tools write a layer: `tar.FileInfoHeader` for each entry, every
/// xattr (ACLs' raw `system.posix_acl_*` values included) as a
/// `SCHILY.xattr.` PAX record, the second and later names of a file as
/// `TypeLink` entries. Standard library only.
pub const GO_WRITER: &str = r#"package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
)

type inode struct{ dev, ino uint64 }

// xattrs reads every extended attribute of a non-symlink path (the
// standard library's calls follow symlinks; the tree's symlinks have none).
func xattrs(path string) (map[string]string, error) {
	out := map[string]string{}
	buf := make([]byte, 1<<16)
	n, err := syscall.Listxattr(path, buf)
	if err != nil {
		return nil, err
	}
	for _, name := range bytes.Split(buf[:n], []byte{0}) {
		if len(name) == 0 {
			continue
		}
		v := make([]byte, 1<<16)
		m, err := syscall.Getxattr(path, string(name), v)
		if err != nil {
			return nil, err
		}
		out[string(name)] = string(v[:m])
	}
	return out, nil
}

func main() {
	src, dst := os.Args[1], os.Args[2]
	f, err := os.Create(dst)
	if err != nil {
		panic(err)
	}
	tw := tar.NewWriter(f)
	seen := map[inode]string{}
	err = filepath.Walk(src, func(path string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		name := "./" + filepath.ToSlash(rel)
		if rel == "." {
			name = "./"
		}
		link := ""
		if fi.Mode()&os.ModeSymlink != 0 {
			if link, err = os.Readlink(path); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		hdr.Name = name
		if fi.IsDir() && rel != "." {
			hdr.Name += "/"
		}
		hdr.Format = tar.FormatPAX
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode().IsRegular() && st.Nlink > 1 {
			key := inode{uint64(st.Dev), uint64(st.Ino)}
			if first, ok := seen[key]; ok {
				hdr.Typeflag = tar.TypeLink
				hdr.Linkname = first
				hdr.Size = 0
				return tw.WriteHeader(hdr)
			}
			seen[key] = name
		}
		if fi.Mode()&os.ModeSymlink == 0 {
			xs, err := xattrs(path)
			if err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			for k, v := range xs {
				if hdr.PAXRecords == nil {
					hdr.PAXRecords = map[string]string{}
				}
				hdr.PAXRecords["SCHILY.xattr."+k] = v
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if hdr.Typeflag == tar.TypeReg {
			in, err := os.Open(path)
			if err != nil {
				return err
			}
			defer in.Close()
			if _, err := io.Copy(tw, in); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		err = tw.Close()
	}
	if err == nil {
		err = f.Close()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
"#;

/// `python3 -c PY FORMAT SRC OUT`: `tarfile` in `pax`, `gnu` or `ustar`
/// format, entry by entry (as `TarFile.add` recurses, sorted), so that
/// what the format cannot hold (ustar's long names, big ids, negative
/// times) is skipped with a line on stderr, not the whole tar; then
/// exits 3 if anything was.
pub const PYTHON_WRITER: &str = r#"
import os, sys, tarfile
fmt = {"pax": tarfile.PAX_FORMAT, "gnu": tarfile.GNU_FORMAT,
       "ustar": tarfile.USTAR_FORMAT}[sys.argv[1]]
src, out = sys.argv[2], sys.argv[3]
skipped = 0
with tarfile.open(out, "w", format=fmt) as t:
    def add(path, arcname):
        global skipped
        try:
            t.add(path, arcname, recursive=False)
        except ValueError as e:
            print(f"{arcname}: {e}", file=sys.stderr)
            skipped += 1
        if os.path.isdir(path) and not os.path.islink(path):
            for n in sorted(os.listdir(path)):
                add(os.path.join(path, n), arcname + "/" + n)
    add(src, ".")
sys.exit(3 if skipped else 0)
"#;

/// `go run prog.go TAR DIR`: the layer applied as Go image tools apply
/// one (the oracle for [`GO_WRITER`]'s tars: GNU tar and bsdtar both
/// drop `SCHILY.xattr.system.posix_acl_*`, which these tools set): each
/// entry as `archive/tar` reads it, then its owner, its mode, every
/// `SCHILY.xattr.` record with setxattr, and last, deepest first, the
/// mtimes. Standard library only.
pub const GO_EXTRACTOR: &str = r#"package main

import (
	"archive/tar"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
	"unsafe"
)

type stamp struct {
	path string
	t    time.Time
}

func mkdev(major, minor int64) int {
	return int((minor & 0xff) | ((major & 0xfff) << 8) | ((minor &^ 0xff) << 12) | ((major &^ 0xfff) << 32))
}

// lutimes sets a path's atime and mtime without following a symlink
// (utimensat(2) with AT_SYMLINK_NOFOLLOW: the standard library's calls
// follow).
func lutimes(path string, t time.Time) error {
	p, err := syscall.BytePtrFromString(path)
	if err != nil {
		return err
	}
	one := syscall.Timespec{Sec: t.Unix(), Nsec: int64(t.Nanosecond())}
	ts := [2]syscall.Timespec{one, one}
	_, _, e := syscall.Syscall6(syscall.SYS_UTIMENSAT, uintptr(0xffffffffffffff9c), uintptr(unsafe.Pointer(p)), uintptr(unsafe.Pointer(&ts[0])), 0x100, 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

func apply(tr *tar.Reader, dst string) error {
	var stamps []stamp
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		path := filepath.Join(dst, hdr.Name)
		mode := uint32(hdr.Mode) & 07777
		switch hdr.Typeflag {
		case tar.TypeDir:
			if path != dst {
				err = os.Mkdir(path, 0700)
			}
		case tar.TypeReg:
			var f *os.File
			if f, err = os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0600); err == nil {
				_, err = io.Copy(f, tr)
				if e := f.Close(); err == nil {
					err = e
				}
			}
		case tar.TypeSymlink:
			err = os.Symlink(hdr.Linkname, path)
		case tar.TypeLink:
			if err = os.Link(filepath.Join(dst, hdr.Linkname), path); err != nil {
				return err
			}
			continue
		case tar.TypeChar:
			err = syscall.Mknod(path, syscall.S_IFCHR|mode, mkdev(hdr.Devmajor, hdr.Devminor))
		case tar.TypeBlock:
			err = syscall.Mknod(path, syscall.S_IFBLK|mode, mkdev(hdr.Devmajor, hdr.Devminor))
		case tar.TypeFifo:
			err = syscall.Mkfifo(path, mode)
		default:
			err = fmt.Errorf("type %q", hdr.Typeflag)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", hdr.Name, err)
		}
		// Owner before mode and xattrs: chown clears set-id bits and
		// security.capability.
		if err = syscall.Lchown(path, hdr.Uid, hdr.Gid); err != nil {
			return fmt.Errorf("%s: %w", hdr.Name, err)
		}
		if hdr.Typeflag != tar.TypeSymlink {
			if err = syscall.Chmod(path, mode); err != nil {
				return fmt.Errorf("%s: %w", hdr.Name, err)
			}
			for k, v := range hdr.PAXRecords {
				if name := strings.TrimPrefix(k, "SCHILY.xattr."); name != k {
					if err = syscall.Setxattr(path, name, []byte(v), 0); err != nil {
						return fmt.Errorf("%s: %s: %w", hdr.Name, name, err)
					}
				}
			}
		}
		stamps = append(stamps, stamp{path, hdr.ModTime})
	}
	for i := len(stamps) - 1; i >= 0; i-- {
		if err := lutimes(stamps[i].path, stamps[i].t); err != nil {
			return fmt.Errorf("%s: %w", stamps[i].path, err)
		}
	}
	return nil
}

func main() {
	f, err := os.Open(os.Args[1])
	if err == nil {
		err = apply(tar.NewReader(f), os.Args[2])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
"#;
