package coord

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// delayProxy forwards TCP connections to target, delaying every chunk in each direction by
// the current delay; a chunk read before the client closed is still delivered.
type delayProxy struct {
	delay atomic.Int64 // ns
	addr  string
}

func newDelayProxy(t *testing.T, target string) *delayProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &delayProxy{addr: ln.Addr().String()}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			go p.copy(u, c)
			go p.copy(c, u)
		}
	}()
	return p
}

func (p *delayProxy) copy(dst, src net.Conn) {
	type chunk struct {
		b   []byte
		due time.Time
	}
	chunks := make(chan chunk, 4096)
	go func() {
		defer dst.Close()
		for k := range chunks {
			time.Sleep(time.Until(k.due))
			if _, err := dst.Write(k.b); err != nil {
				for range chunks {
				}
				return
			}
		}
		time.Sleep(50 * time.Millisecond) // let the other end act on the last bytes
	}()
	defer close(chunks)
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			chunks <- chunk{append([]byte(nil), buf[:n]...), time.Now().Add(time.Duration(p.delay.Load()))}
		}
		if err != nil {
			return
		}
	}
}
