package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// ErrUnavailable marks a machine without redis-server: [Need] skips on it (outside CI).
var ErrUnavailable = errors.New("redistest: redis-server is not installed")

// readyTimeout bounds the wait for a started server to answer PING.
const readyTimeout = 20 * time.Second

// portAttempts is how often a start is retried on a fresh port, as another process may take
// a free port before the server binds it.
const portAttempts = 5

// Server is a throwaway redis-server. Addr and URL do not change, not even across Restart.
// Methods are safe for concurrent use. The zero value is not a server; get one from [Start]
// or [Need].
type Server struct {
	Addr string // host:port
	Port int
	URL  string // redis://127.0.0.1:port/0

	bin    string
	dir    string
	reaper *exec.Cmd
	pipe   *os.File // write end of the reaper's stdin

	mu      sync.Mutex // protects the fields below
	cmd     *exec.Cmd  // the running server; nil when killed or stopped
	exited  chan struct{}
	stopped bool
}

// Required reports whether tests needing Redis must fail rather than skip when it is
// missing: when the environment variable CI is true.
func Required() bool {
	ci, _ := strconv.ParseBool(os.Getenv("CI"))
	return ci
}

// Need starts a server for tb, stopped when tb's test ends. Without redis-server it skips
// tb, or fails it under CI=true; any other failure to start fails tb. Under go test -short
// (make unit: the tests that need no server) it skips tb without looking for redis-server,
// also under CI=true, as internal/pgtest does.
func Need(tb testing.TB) *Server {
	tb.Helper()
	if testing.Short() {
		tb.Skip("needs redis-server: not run under -short (unit tests only)")
	}
	s, err := Start()
	if err != nil {
		if errors.Is(err, ErrUnavailable) && !Required() {
			tb.Skipf("%v (apt-get install redis-server)", err)
		}
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := s.Stop(); err != nil {
			tb.Error(err)
		}
	})
	return s
}

// Start starts a new server. The caller must Stop it; a server left running is killed when
// the process ends.
func Start() (*Server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	dir, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		return nil, fmt.Errorf("redistest: %w", err)
	}
	s := &Server{bin: bin, dir: dir}
	if err := s.startReaper(); err != nil {
		return nil, errors.Join(err, os.RemoveAll(dir))
	}
	for range portAttempts {
		var port int
		if port, err = freePort(); err != nil {
			break
		}
		s.Port, s.Addr = port, net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		s.URL = "redis://" + s.Addr + "/0"
		if err = s.boot(); err == nil {
			return s, nil
		}
		if !strings.Contains(err.Error(), "in use") {
			break
		}
	}
	return nil, errors.Join(err, s.Stop())
}

// boot starts redis-server on s.Port and waits until it answers PING.
func (s *Server) boot() error {
	cmd := exec.Command(s.bin,
		"--port", strconv.Itoa(s.Port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--daemonize", "no",
		"--dir", s.dir, "--pidfile", s.pidPath(), "--logfile", s.logPath())
	cmd.Dir = s.dir
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("redistest: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	s.mu.Lock()
	s.cmd, s.exited = cmd, exited
	s.mu.Unlock()

	deadline := time.Now().Add(readyTimeout)
	for {
		if err := ping(s.Addr); err == nil {
			return nil
		}
		select {
		case <-exited:
			s.mu.Lock()
			s.cmd = nil
			s.mu.Unlock()
			return fmt.Errorf("redistest: redis-server exited at start\nlog:\n%s", s.logTail())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redistest: redis-server on %s not ready after %v\nlog:\n%s", s.Addr, readyTimeout, s.logTail())
		}
	}
}

// ping sends PING and expects +PONG.
func ping(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	if strings.TrimSpace(line) != "+PONG" {
		return fmt.Errorf("redistest: PING answered %q", line)
	}
	return nil
}

// Pause stops the server process (SIGSTOP): connections stay open and nothing answers, as
// with a Redis that hangs.
func (s *Server) Pause() error { return s.signal(syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume() error { return s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return errors.New("redistest: the server is not running")
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("redistest: %w", err)
	}
	return nil
}

// Kill kills the server (SIGKILL) and waits for it to exit; its data is lost.
func (s *Server) Kill() error {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return nil
	}
	if err := cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("redistest: %w", err)
	}
	<-exited
	return nil
}

// Restart starts the server again on the same port after Kill (or kills it first), with
// empty memory, as after a crash.
func (s *Server) Restart() error {
	if err := s.Kill(); err != nil {
		return err
	}
	s.mu.Lock()
	stopped := s.stopped
	s.mu.Unlock()
	if stopped {
		return errors.New("redistest: Restart of a stopped server")
	}
	return s.boot()
}

// Stop kills the server and removes its directory. It does nothing a second time.
func (s *Server) Stop() error {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return nil
	}
	s.stopped = true
	s.mu.Unlock()
	err := s.Kill()
	if s.pipe != nil {
		err = errors.Join(err, s.pipe.Close())
		err = errors.Join(err, s.reaper.Wait())
	}
	if rerr := os.RemoveAll(s.dir); rerr != nil {
		err = errors.Join(err, fmt.Errorf("redistest: %w", rerr))
	}
	return err
}

// reaperScript waits for end of file on its standard input, which comes when the test
// process closes the pipe or dies in any way, then kills the server named by the pid file
// and removes the directory.
const reaperScript = `read -r _ || true; if [ -f "$RT_DIR/redis.pid" ]; then kill -9 "$(cat "$RT_DIR/redis.pid")" 2>/dev/null; fi; rm -rf -- "$RT_DIR"`

func (s *Server) startReaper() error {
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("redistest: reaper: %w", err)
	}
	cmd := exec.Command("/bin/sh", "-c", reaperScript, "redistest-reaper")
	cmd.Stdin = r
	cmd.Env = append(os.Environ(), "RT_DIR="+s.dir)
	cmd.Dir = "/"
	// Its own process group, so a Ctrl-C meant for the tests does not kill it before it acts.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	r.Close()
	if err != nil {
		w.Close()
		return fmt.Errorf("redistest: reaper: %w", err)
	}
	s.reaper, s.pipe = cmd, w
	return nil
}

func (s *Server) pidPath() string { return filepath.Join(s.dir, "redis.pid") }
func (s *Server) logPath() string { return filepath.Join(s.dir, "redis.log") }

func (s *Server) logTail() string {
	b, err := os.ReadFile(s.logPath())
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	if len(b) > 4<<10 {
		b = b[len(b)-4<<10:]
	}
	return strings.TrimRight(string(b), "\n")
}

// freePort asks the kernel for a free loopback port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("redistest: pick a port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	return port, l.Close()
}
