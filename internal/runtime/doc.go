// Package runtime runs what changes the rules an engine decides by, beside the statements: it
// compiles each Config into the engine and installs it (SetConfig), watches the rules file
// (WatchFile), and starts, reconfigures and stops the health sampler, the server clock reader
// (package serverclock) and the coordinator of shared budgets (Close stops them all). No
// statement waits for it: it holds its lock for in-memory steps only, never across a compile, a
// file read, Redis or the database.
//
// It may import the engine (internal/engine) and the packages the engine is made of
// (internal/budget, internal/health), internal/coord, internal/serverclock, driver/rules,
// fsnotify and go-redis, never a database driver (the driver hands it the
// health sampler's connection as a health.Conn, the server clock's as a serverclock.Conn); only
// the driver imports it.
package runtime
