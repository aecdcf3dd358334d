//go:build unix

package runtime

import (
	"io/fs"
	"syscall"
)

// idOf is the identity of the file fi describes: its device and inode numbers.
func idOf(fi fs.FileInfo) fileID {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}
	}
	return fileID{dev: uint64(st.Dev), ino: uint64(st.Ino)}
}
