package coord

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"github.com/pgtraffic/pgtraffic/internal/bounded"
	"github.com/pgtraffic/pgtraffic/internal/health"
)

//go:embed election.lua
var electionSource string

var electionScript = redis.NewScript(electionSource)

// Bounds of a published health sample, beside [health.MaxSharedReadings]: what an honest lead
// writes is far smaller, so anything beyond them is a forgery or a corruption, read as stale.
const (
	maxSampleBytes = 64 << 10
	maxSampleText  = 1024 // a metric name or an error
	// maxSampleAge: a sample is stale after three health intervals, and a reader may poll a
	// round late; older than that under the longest interval, it cannot be honest.
	maxSampleAge = 4 * vocab.MaxHealthInterval
	sampleFormat = 1 // the version written, and the only one read
)

// Election is the health sampler election of one database through Redis: it implements
// [health.Election]. Per metric set, the instance holding a lease key samples and publishes
// its readings in a sample key; the others read them. Both keys are named by a digest of the
// database's identity and of the set, so no host, user or database name reaches Redis, and
// share one hash tag, as a script touching both needs on Redis Cluster.
//
// A sample is dated by Redis's clock at the lead's last election round, before it read what it
// publishes, and each reading carries its age at publication as measured by the lead, so a
// reading's age never depends on two instances' clocks agreeing, and a sample's date is never
// later than its readings.
//
// Redis is not trusted with the sample (see [health.Election]). The lead signs each sample,
// with its date and its key's name, by an HMAC whose key is derived from a secret of the
// database (ElectionOptions.Secret): an instance that can read the database can sign, whoever
// can only write Redis cannot. A follower reads no sample that is unsigned or whose signature
// does not match (Elect fails with an error wrapping [ErrUnsigned], and the sampler samples for
// itself), so a forged sample never reads as healthy, and a replayed one is dated when it was
// signed: old, so stale. Signed samples are validated too: malformed, too large, dated in the
// future or absurdly old ones come back as [health.Vote.Bad].
//
// One call per metric set (Ballot.Set) is outstanding at a time; a call that overruns its
// context is abandoned and finishes in the background, and calls of that set made meanwhile
// fail at once. The sets do not wait for each other: the health sampler and the server
// clock's reader share one Election, and a slow call of one must not make the other's vote
// fail (and its instance read the server for itself). An Election is safe for concurrent use;
// build one with [NewElection] and release it with [Election.Close].
type Election struct {
	rc     redis.UniversalClient
	owned  *redis.Client // made from the URL, closed by Close; nil when given a client
	id     string
	db     string // identifies the database in the key digests
	secret func(ctx context.Context) (string, error)
	life   context.Context // cancelled by Close: ends the secret's reading
	stop   context.CancelFunc

	mu   sync.Mutex          // protects the fields below
	busy map[string]struct{} // the sets with a call outstanding
	// key signs and verifies samples; nil until the secret is read (readKey), and known is
	// closed then; tried is closed once the first reading has ended, however it ended.
	// reading is set once the first call has started reading it.
	key          []byte
	known, tried chan struct{}
	reading      bool
	// elected is, per set, Redis's time (µs) of this instance's last round that made it the
	// lead: the date its next sample is signed with.
	elected map[string]int64
}

// ElectionOptions configure an [Election]. Client or URL, Instance and Database are required.
type ElectionOptions struct {
	// Client reaches Redis; when nil, a client is made from URL (the coordination section's),
	// set up as the coordinator's with SyncInterval.
	Client       redis.UniversalClient
	URL          string
	SyncInterval time.Duration
	// Instance names this instance in the lease; two live elections must never share one.
	Instance string
	// Database identifies the database sampled, e.g. user@host:port/dbname: instances whose
	// identities are equal share a sampler. It must hold no secret; it is only digested.
	Database string
	// Secret reads, on the database, a value that every instance of it can read and that Redis
	// does not hold (the driver reads the cluster's system identifier): the samples are signed
	// with a key derived from it. Required. It is called in the background from the first
	// call of the election, until it succeeds or the election is closed; until then Elect and
	// Publish fail with an error wrapping [health.ErrNotReady], and each instance samples for
	// itself.
	Secret func(ctx context.Context) (string, error)
}

// ErrUnsigned is the error (errors.Is) of an Elect that found a sample not signed with this
// database's key: written by someone who cannot read the database, or by an instance of
// another database under the same identity. Nothing of it is read; the caller samples for
// itself.
var ErrUnsigned = errors.New("coord: the published sample is not signed with this database's key")

// secretRetry bounds the wait between two failed readings of the secret (doubling from a
// second); secretTimeout bounds one reading (a connect and a query).
const (
	secretRetry   = time.Minute
	secretTimeout = 10 * time.Second
)

var _ health.Election = (*Election)(nil)

// NewElection returns an election. Its only error is an invalid URL, which never quotes the
// URL's credentials.
func NewElection(o ElectionOptions) (*Election, error) {
	if o.Secret == nil {
		return nil, errors.New("coord: ElectionOptions.Secret is nil")
	}
	e := &Election{rc: o.Client, id: o.Instance, db: o.Database, secret: o.Secret, busy: map[string]struct{}{},
		known: make(chan struct{}), tried: make(chan struct{}), elected: map[string]int64{}}
	e.life, e.stop = context.WithCancel(context.Background())
	if e.rc == nil {
		rc, err := clientFor(o.URL, o.SyncInterval)
		if err != nil {
			return nil, err
		}
		e.rc, e.owned = rc, rc
	}
	return e, nil
}

// Close stops reading the secret and closes the client made from the URL. Leases still held
// lapse by themselves.
func (e *Election) Close() error {
	e.stop()
	if e.owned != nil {
		return e.owned.Close()
	}
	return nil
}

// ElectionKeys returns the lease and sample keys of a metric set of a database:
// pgtraffic:{health:<digest>}:lease and :sample.
func ElectionKeys(database, set string) (lease, sample string) {
	sum := sha256.Sum256([]byte("pgtraffic health sampler\x00" + database + "\x00" + set))
	tag := KeyPrefix + "{health:" + hex.EncodeToString(sum[:16]) + "}:"
	return tag + "lease", tag + "sample"
}

// wireSample is a published sample as stored in Redis (JSON, under the sample key's data;
// its date and signature are the hash's at and sig).
type wireSample struct {
	Format   int           `json:"f"`
	Readings []wireReading `json:"r"`
}

type wireReading struct {
	Metric string `json:"m"`
	Value  string `json:"v,omitempty"` // strconv's shortest exact form, which JSON numbers lack for ±Inf
	Age    int64  `json:"a"`           // µs between the read and the publication
	Err    string `json:"e,omitempty"`
}

// Elect implements [health.Election].
func (e *Election) Elect(ctx context.Context, b health.Ballot) (health.Vote, error) {
	key, err := e.keyFor(ctx)
	if err != nil {
		return health.Vote{}, err
	}
	v, err := e.run(ctx, b, "elect", strconv.Itoa(maxSampleBytes))
	if err != nil {
		return health.Vote{}, err
	}
	now, _ := v[0].(int64)
	switch status := v[1]; status {
	case "lead":
		e.mu.Lock()
		e.elected[b.Set] = now
		e.mu.Unlock()
		return health.Vote{Lead: true}, nil
	case "none":
		return health.Vote{}, nil
	case "bad":
		if len(v) == 3 {
			if why, ok := v[2].(string); ok && len(why) <= maxSampleText {
				return health.Vote{Bad: why}, nil
			}
		}
	case "follow":
		if len(v) == 5 {
			at, _ := v[2].(string)
			data, _ := v[3].(string)
			sig, _ := v[4].(string)
			_, sample := ElectionKeys(e.db, b.Set)
			if !hmac.Equal([]byte(sig), []byte(sign(key, sample, at, data))) {
				return health.Vote{}, ErrUnsigned
			}
			readings, bad := decodeSample(now, at, data)
			return health.Vote{Published: readings, Bad: bad}, nil
		}
	}
	return health.Vote{Bad: "unexpected reply from the election script"}, nil
}

// Publish implements [health.Election]: the sample is written only while this instance
// holds the lease, dated and signed as the type's documentation says.
func (e *Election) Publish(ctx context.Context, b health.Ballot, readings []health.Shared) error {
	key, err := e.keyFor(ctx)
	if err != nil {
		return err
	}
	e.mu.Lock()
	elected, ok := e.elected[b.Set]
	e.mu.Unlock()
	if !ok {
		return errors.New("coord: publishing a sample of a set this instance was never elected for")
	}
	w := wireSample{Format: sampleFormat, Readings: make([]wireReading, len(readings))}
	for i, r := range readings {
		// A read's error can quote the server at any length: cut, so that the followers do not
		// reject the sample as a forgery (decodeSample). A metric's name is bounded by the rules.
		w.Readings[i] = wireReading{Metric: r.Metric, Age: r.Age.Microseconds(), Err: bounded.Cut(r.Err, maxSampleText)}
		if r.Err == "" {
			w.Readings[i].Value = strconv.FormatFloat(r.Value, 'g', -1, 64)
		}
	}
	data, err := json.Marshal(w)
	if err != nil {
		return fmt.Errorf("coord: encoding a health sample: %w", err)
	}
	at := strconv.FormatInt(elected, 10)
	_, sample := ElectionKeys(e.db, b.Set)
	_, err = e.run(ctx, b, "publish", string(data), at, sign(key, sample, at, string(data)))
	return err
}

// sign is the signature of a sample: the hex HMAC-SHA256 under key of the sample key's name
// (the database and the set), its date at and its data, each length-prefixed.
func sign(key []byte, sampleKey, at, data string) string {
	m := hmac.New(sha256.New, key)
	for _, s := range []string{sampleKey, at, data} {
		m.Write([]byte(strconv.Itoa(len(s)) + ":" + s))
	}
	return hex.EncodeToString(m.Sum(nil))
}

// keyOf is the key samples are signed with, derived from the database's secret.
func keyOf(secret string) []byte {
	sum := sha256.Sum256([]byte("pgtraffic election key\x00" + secret))
	return sum[:]
}

// keyFor returns the key samples are signed with, reading the secret first when no call has
// yet: it waits for the first reading as long as ctx lets it, and fails with an error wrapping
// health.ErrNotReady when the key is not known by then, or at once once a reading failed (the
// next is tried in the background).
func (e *Election) keyFor(ctx context.Context) ([]byte, error) {
	e.mu.Lock()
	if !e.reading {
		e.reading = true
		go e.readKey()
	}
	e.mu.Unlock()
	select {
	case <-e.known:
	case <-e.tried:
	case <-ctx.Done():
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.key == nil {
		return nil, fmt.Errorf("coord: %w: the database's secret is not read yet", health.ErrNotReady)
	}
	return e.key, nil
}

// readKey reads the secret until it succeeds or the election is closed, waiting longer after
// each failure (secretRetry), and derives the key from it.
func (e *Election) readKey() {
	for n, wait := 0, time.Second; ; n, wait = n+1, min(2*wait, secretRetry) {
		ctx, cancel := context.WithTimeout(e.life, secretTimeout)
		secret, err := e.secret(ctx)
		cancel()
		if err == nil {
			e.mu.Lock()
			e.key = keyOf(secret)
			e.mu.Unlock()
			close(e.known)
		}
		if n == 0 {
			close(e.tried)
		}
		if err == nil {
			return
		}
		select {
		case <-e.life.Done():
			return
		case <-time.After(wait):
		}
	}
}

// Resign implements [health.Election].
func (e *Election) Resign(ctx context.Context, b health.Ballot) error {
	_, err := e.run(ctx, b, "resign")
	return err
}

// run calls the election script, abandoning the call when ctx ends even if the client does
// not honour the deadline; the abandoned call finishes in the background, and no other call
// of b.Set starts until it has. Its reply has at least Redis's time and a status.
//
// The call itself may take four times what ctx leaves (callContext): a call after a failure
// runs on a new connection, whose handshake (HELLO, then EVALSHA, and EVAL where Redis lost the
// script) costs round trips of its own; ended with its caller, every call after one failure to
// a Redis more than half the caller's time away would fail the same way, and every instance
// would sample for itself for good. Finished in the background, it leaves the next call a warm
// connection.
func (e *Election) run(ctx context.Context, b health.Ballot, op string, arg ...string) ([]any, error) {
	e.mu.Lock()
	_, busy := e.busy[b.Set]
	if !busy {
		e.busy[b.Set] = struct{}{}
	}
	e.mu.Unlock()
	if busy {
		return nil, errBusy
	}
	lease, sample := ElectionKeys(e.db, b.Set)
	args := []any{op, e.id, max(health.LeaseIntervals*b.Interval.Milliseconds(), 1),
		max(health.StaleIntervals*b.Interval.Milliseconds(), 1)}
	for _, a := range arg {
		args = append(args, a)
	}
	type outcome struct {
		v   []any
		err error
	}
	ch := make(chan outcome, 1)
	callCtx, cancel := e.callContext(ctx)
	go func() {
		defer cancel()
		v, err := electionScript.Run(callCtx, e.rc, []string{lease, sample}, args...).Slice()
		e.mu.Lock()
		delete(e.busy, b.Set) // before the answer, so that the next call never finds this one outstanding
		e.mu.Unlock()
		ch <- outcome{v, err}
	}()
	select {
	case o := <-ch:
		if o.err != nil {
			return nil, o.err
		}
		if len(o.v) < 2 {
			return nil, fmt.Errorf("coord: election script returned %d values", len(o.v))
		}
		return o.v, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// callContext is the context of a script call made for ctx: four times the time ctx leaves
// (see run), ending with the election all the same; ctx itself when it has no deadline.
func (e *Election) callContext(ctx context.Context) (context.Context, context.CancelFunc) {
	d, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(e.life, 4*time.Until(d))
}

// decodeSample reads a published sample, whose signature was checked: at is its date in µs of
// Redis's clock (the lead's election round before it read the readings), now the same clock at
// the read. bad says why it cannot be trusted; readings' ages then mean
// nothing.
func decodeSample(now int64, at, data string) (readings []health.Shared, bad string) {
	published, err := strconv.ParseInt(at, 10, 64)
	switch {
	case err != nil || published < 0:
		return nil, "unreadable date"
	case published > now:
		return nil, "dated in the future"
	case len(data) > maxSampleBytes:
		return nil, "too large"
	}
	var w wireSample
	if err := json.Unmarshal([]byte(data), &w); err != nil {
		return nil, "not a sample"
	}
	if w.Format != sampleFormat {
		return nil, fmt.Sprintf("format %d, want %d", w.Format, sampleFormat)
	}
	if len(w.Readings) > health.MaxSharedReadings {
		return nil, "too many readings"
	}
	// Capped just past maxSampleAge before the conversion: µs from a date centuries back
	// overflow a Duration, which could then read as a negative age.
	since := time.Duration(min(now-published, maxSampleAge.Microseconds()+1)) * time.Microsecond
	out := make([]health.Shared, len(w.Readings))
	for i, r := range w.Readings {
		if len(r.Metric) > maxSampleText || len(r.Err) > maxSampleText {
			return nil, "a reading too long"
		}
		if r.Age < 0 || r.Age > maxSampleAge.Microseconds() || since > maxSampleAge {
			return nil, "a reading dated in the future or absurdly old"
		}
		s := health.Shared{Metric: r.Metric, Err: r.Err, Age: since + time.Duration(r.Age)*time.Microsecond}
		if r.Err == "" {
			if s.Value, err = strconv.ParseFloat(r.Value, 64); err != nil {
				return nil, "an unreadable value"
			}
		}
		out[i] = s
	}
	return out, ""
}
