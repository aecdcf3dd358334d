package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// errUnavailable marks a machine without PostgreSQL: [Shared] skips on it (outside CI) rather
// than failing. Any other start error is a real failure.
var errUnavailable = errors.New("pgtest: PostgreSQL is not available")

// debianRoot is where Debian and Ubuntu install one directory per major version.
const debianRoot = "/usr/lib/postgresql"

// commandTimeout bounds each server binary run, so a wedged initdb or pg_ctl fails the test
// instead of hanging it until the go test timeout.
const commandTimeout = 2 * time.Minute

// toolchain locates the PostgreSQL binaries and runs them, as the postgres user when the
// process is root. Its zero value is not usable; build one with findToolchain. It is immutable
// and safe for concurrent use.
type toolchain struct {
	binDir  string // directory holding initdb, pg_ctl and postgres
	runuser string // path of runuser(1) when running as root, else ""
	uid     int    // owner to give files the server must write; -1 to leave as is
	gid     int
}

// findToolchain finds the PostgreSQL binaries on this machine. It returns an error wrapping
// errUnavailable when there are none, or when the process is root and cannot switch to the
// postgres user.
func findToolchain() (*toolchain, error) {
	binDir, err := findBinDir(os.Getenv("PATH"), debianRoot)
	if err != nil {
		return nil, err
	}
	tc := &toolchain{binDir: binDir, uid: -1, gid: -1}
	if os.Geteuid() != 0 {
		return tc, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("%w: running as root needs a postgres user to run the server: %v", errUnavailable, err)
	}
	if tc.uid, err = strconv.Atoi(u.Uid); err != nil {
		return nil, fmt.Errorf("pgtest: postgres uid %q: %w", u.Uid, err)
	}
	if tc.gid, err = strconv.Atoi(u.Gid); err != nil {
		return nil, fmt.Errorf("pgtest: postgres gid %q: %w", u.Gid, err)
	}
	if tc.runuser, err = exec.LookPath("runuser"); err != nil {
		return nil, fmt.Errorf("%w: running as root needs runuser(1) to run the server as postgres: %v", errUnavailable, err)
	}
	return tc, nil
}

// findBinDir returns the directory of the server binaries: that of the initdb on path (with
// symlinks resolved, because distributions link a single initdb into a directory that lacks
// the rest), else the highest version under debian.
func findBinDir(path, debian string) (string, error) {
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			continue
		}
		initdb := filepath.Join(dir, "initdb")
		if !isExecutable(initdb) {
			continue
		}
		if real, err := filepath.EvalSymlinks(initdb); err == nil {
			initdb = real
		}
		bin := filepath.Dir(initdb)
		if isExecutable(filepath.Join(bin, "pg_ctl")) {
			return bin, nil
		}
	}
	entries, err := os.ReadDir(debian)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("pgtest: %w", err)
	}
	var best string
	var bestVersion []int
	for _, e := range entries {
		version, ok := parseVersion(e.Name())
		bin := filepath.Join(debian, e.Name(), "bin")
		if !ok || !isExecutable(filepath.Join(bin, "initdb")) || !isExecutable(filepath.Join(bin, "pg_ctl")) {
			continue
		}
		if best == "" || slices.Compare(version, bestVersion) > 0 {
			best, bestVersion = bin, version
		}
	}
	if best == "" {
		return "", fmt.Errorf("%w: no initdb and pg_ctl on PATH or in %s/*/bin", errUnavailable, debian)
	}
	return best, nil
}

// parseVersion reads a directory name such as "15" or "9.6" as numbers, so that 15 sorts
// above 9.6.
func parseVersion(name string) ([]int, bool) {
	var version []int
	for part := range strings.SplitSeq(name, ".") {
		n, err := strconv.Atoi(part)
		if err != nil || n < 0 {
			return nil, false
		}
		version = append(version, n)
	}
	return version, true
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// tool returns the path of a PostgreSQL program: from the server's directory when it is there,
// else from PATH (Debian puts client tools such as pg_basebackup behind a wrapper in /usr/bin).
// hasLibrary reports whether the server's library directory (beside its bin directory, as in
// Debian's and PostgreSQL's own layouts) holds the loadable module name.
func (tc *toolchain) hasLibrary(name string) bool {
	return fileExists(filepath.Join(filepath.Dir(tc.binDir), "lib", name+".so"))
}

func (tc *toolchain) tool(name string) string {
	if p := filepath.Join(tc.binDir, name); isExecutable(p) {
		return p
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	return filepath.Join(tc.binDir, name) // fails at run time with a clear "not found"
}

// argv is the command line for a PostgreSQL program, run as postgres when we are root.
func (tc *toolchain) argv(name string, args ...string) []string {
	argv := append([]string{tc.tool(name)}, args...)
	if tc.runuser != "" {
		argv = append([]string{tc.runuser, "-u", "postgres", "--"}, argv...)
	}
	return argv
}

// command builds the command for a PostgreSQL program, run in dir.
func (tc *toolchain) command(ctx context.Context, dir, name string, args ...string) *exec.Cmd {
	argv := tc.argv(name, args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = serverEnv()
	// The caller's directory may not be readable by postgres; PostgreSQL programs complain then.
	cmd.Dir = dir
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	return cmd
}

// run runs a PostgreSQL program and returns its combined output, which goes into errors.
func (tc *toolchain) run(dir, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), commandTimeout)
	defer cancel()
	out, err := tc.command(ctx, dir, name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("pgtest: %s %s: %w\n%s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// chown gives path to the postgres user when the server runs as postgres.
func (tc *toolchain) chown(path string) error {
	if tc.uid < 0 {
		return nil
	}
	if err := os.Chown(path, tc.uid, tc.gid); err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	return nil
}

// serverEnv is the environment for server programs: ours without the PG* variables, which
// would otherwise redirect pg_ctl or pg_basebackup to another server or data directory, and
// with untranslated messages, which startCluster searches for known failures.
func serverEnv() []string {
	env := make([]string, 0, len(os.Environ())+1)
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PG") || strings.HasPrefix(kv, "LC_ALL=") || strings.HasPrefix(kv, "LANGUAGE=") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "LC_ALL=C")
}
