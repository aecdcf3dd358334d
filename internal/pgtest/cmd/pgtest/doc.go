// Command pgtest starts a throwaway PostgreSQL cluster, prints its DSN on one line of standard
// output, and stops and removes the cluster on SIGINT or SIGTERM (or, with -stdin, when
// standard input is closed). Scripts such as integration/scripts/instr.sh use it as a disposable server:
//
//	go build -o /tmp/pgserver ./internal/pgtest/cmd/pgtest
//	/tmp/pgserver >dsn &
//
// It imports only internal/pgtest.
package main
