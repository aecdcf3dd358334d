package pgtest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
)

// reaperScript waits for end of file on its standard input, which comes when the test process
// closes the pipe or dies in any way (panic, test timeout, os.Exit, SIGKILL), then stops the
// cluster with the command in its arguments and removes the directory.
const reaperScript = `read -r _ || true; "$@" >/dev/null 2>&1; rm -rf -- "$PGTEST_ROOT"`

// reaper is a watcher process that stops and removes a cluster when the test process ends
// without doing so. The zero value is not usable; start one with startReaper. close is called
// once, by Server.Stop, under the server's mutex.
type reaper struct {
	pipe *os.File // write end of the reaper's stdin; only this process holds it
	cmd  *exec.Cmd
}

func startReaper(tc *toolchain, root, dataDir string) (*reaper, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("pgtest: reaper: %w", err)
	}
	argv := append([]string{"-c", reaperScript, "pgtest-reaper"},
		tc.argv("pg_ctl", "stop", "-D", dataDir, "-m", "immediate", "-w")...)
	cmd := exec.Command("/bin/sh", argv...)
	cmd.Stdin = r
	// Stdout and stderr stay /dev/null: an inherited pipe would make go test wait for it.
	cmd.Env = append(serverEnv(), "PGTEST_ROOT="+root)
	cmd.Dir = "/"
	// Its own process group, so a Ctrl-C meant for the tests does not kill it before it acts.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	r.Close() // the reaper holds the read end now
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("pgtest: reaper: %w", err)
	}
	return &reaper{pipe: w, cmd: cmd}, nil
}

// close lets the reaper run (a no-op by then, the cluster being gone) and waits for it.
func (r *reaper) close() error {
	err := r.pipe.Close()
	return errors.Join(err, r.cmd.Wait())
}
