package redistest

import (
	"os"
	"testing"
)

func TestLifecycle(t *testing.T) {
	s := Need(t)
	if err := ping(s.Addr); err != nil {
		t.Fatalf("a started server does not answer: %v", err)
	}
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	if err := ping(s.Addr); err == nil {
		t.Fatal("a paused server answered PING")
	}
	if err := s.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := ping(s.Addr); err != nil {
		t.Fatalf("a resumed server does not answer: %v", err)
	}
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := ping(s.Addr); err == nil {
		t.Fatal("a killed server answered PING")
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := ping(s.Addr); err != nil {
		t.Fatalf("a restarted server does not answer on its port: %v", err)
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.dir); !os.IsNotExist(err) {
		t.Fatalf("Stop left %s: %v", s.dir, err)
	}
	if err := s.Restart(); err == nil {
		t.Fatal("Restart of a stopped server succeeded")
	}
}

func TestKilledProcessLeavesNoServer(t *testing.T) {
	// The reaper acts when the pipe closes, as it does when the test process dies.
	s := Need(t)
	s.mu.Lock()
	pid := s.cmd.Process.Pid
	s.mu.Unlock()
	if err := s.pipe.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.reaper.Wait(); err != nil {
		t.Fatal(err)
	}
	s.pipe = nil
	<-s.exited
	if _, err := os.Stat(s.dir); !os.IsNotExist(err) {
		t.Fatalf("the reaper left %s: %v", s.dir, err)
	}
	if err := ping(s.Addr); err == nil {
		t.Fatalf("server pid %d still answers after the reaper ran", pid)
	}
}
