package delayproxy

import (
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy is a delaying TCP proxy, stopped when the test that started it ends.
type Proxy struct {
	Addr  string       // where to connect: 127.0.0.1:port
	delay atomic.Int64 // one way, in nanoseconds
}

// Start forwards the connections made to the returned proxy's Addr to target, each chunk
// delayed by oneWay in each direction, until tb ends.
func Start(tb testing.TB, target string, oneWay time.Duration) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &Proxy{Addr: ln.Addr().String()}
	p.SetDelay(oneWay)
	var wg sync.WaitGroup
	tb.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
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
	})
	return p
}

// SetDelay sets the one-way delay of the chunks read from now on.
func (p *Proxy) SetDelay(oneWay time.Duration) { p.delay.Store(int64(oneWay)) }

// HostPort returns Addr's host and port, as a pgx connection config takes them.
func (p *Proxy) HostPort() (string, uint16) {
	host, port, _ := net.SplitHostPort(p.Addr)
	n, _ := strconv.ParseUint(port, 10, 16)
	return host, uint16(n)
}

// copy copies src to dst, each chunk written the delay after it was read; it closes both when
// either side ends.
func (p *Proxy) copy(dst, src net.Conn) {
	type chunk struct {
		b   []byte
		due time.Time
	}
	chunks := make(chan chunk, 4096)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer dst.Close()
		for k := range chunks {
			time.Sleep(time.Until(k.due))
			if _, err := dst.Write(k.b); err != nil {
				return
			}
		}
	}()
	defer src.Close()
	defer close(chunks)
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			select {
			case chunks <- chunk{b: append([]byte(nil), buf[:n]...), due: time.Now().Add(time.Duration(p.delay.Load()))}:
			case <-done:
				return
			}
		}
		if err != nil {
			return
		}
	}
}
