// Package delayproxy gives tests a TCP proxy that delays what it forwards, to put a PostgreSQL
// server or a Redis some way off: [Start] listens on a loopback port and forwards each
// connection to a target, writing every chunk it reads a one-way delay later, in order, in each
// direction; [Proxy.SetDelay] changes the delay mid-test.
//
// It imports only the standard library; only tests import it.
package delayproxy
