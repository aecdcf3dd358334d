// Package serverclock learns what each pattern costs on the server's clock: how long the
// server itself spent executing it, as PostgreSQL's pg_stat_statements extension reports,
// rather than how long the client waited (which adds the network round trip and the client's
// own scheduling delays, most of the wait for a short statement).
//
// A [Reader] runs in the background on a connection of its own, never one of the
// application's. Every interval it
//
//   - measures one round trip (an empty query) and hands the smallest of the last few to its
//     [Sink] as the network floor, which the engine takes off the client's measurement of each
//     statement: without pg_stat_statements, that is the client clock's correction;
//   - reads the counters (calls, total execution and planning time) of the query identifiers of
//     the patterns the sink knows (the EXPLAIN the engine runs reports each statement's
//     identifier), bounded by the number of identifiers and a timeout, and hands each pattern's
//     mean server seconds since the previous read to the sink.
//
// The counters are cumulative, so only their growth between two reads says anything. The server
// keeps them per identifier and role, and so does the reader: an identifier's growth is the
// sum of its entries'. The first read of an entry only takes its baseline (everything it
// counted before is history of unknown age); an entry whose counters went backwards
// (pg_stat_statements_reset, an entry evicted and re-created) or vanished means no data for
// that read; a read that finds the whole view reset or entries evicted since the last
// (pg_stat_statements_info's stats_reset and dealloc) takes new baselines and teaches nothing,
// and so does a read whose baselines are older than the predictions last (a long gap); rows
// that make no sense are rejected.
// Each of these is counted (Resets, Rejected). A read that fails (the extension is missing,
// the role may not read it, the server is down), and a round that finds statements explained
// but none with a query identifier ([ErrNoQueryID]), is counted in Failures and changes nothing:
// predictions return to the client's clock when the server's reports stop for long enough.
// Nothing here runs on a statement's path, and nothing here can fail or delay one.
//
// It may import internal/cost (the query identifiers it is handed), internal/health (the
// election it shares a read through) and driver/rules/vocab (the default interval), and no
// database driver or Redis client: its connection
// is a [Conn] handed in (package pgxconn implements it with pgx), its election a
// health.Election (package coord implements it on Redis).
package serverclock
