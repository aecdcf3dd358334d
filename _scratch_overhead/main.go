package main

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"flag"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/ngrok/sqlmw"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgtraffic/pgtraffic/tagging"
)

type parentDriver struct{ connector driver.Connector }

func (p parentDriver) Open(string) (driver.Conn, error) { return p.connector.Connect(context.Background()) }
func (p parentDriver) OpenConnector(string) (driver.Connector, error) { return p.connector, nil }

type spanIntr struct {
	sqlmw.NullInterceptor
	tr trace.Tracer
}

var kind = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient)}

func (i spanIntr) ConnQueryContext(ctx context.Context, conn driver.QueryerContext, query string, args []driver.NamedValue) (context.Context, driver.Rows, error) {
	_, span := i.tr.Start(ctx, "x", kind...)
	rows, err := conn.QueryContext(ctx, query, args)
	span.End()
	return ctx, rows, err
}

func main() {
	dsn := flag.String("dsn", "", "")
	mode := flag.String("mode", "", "")
	n := flag.Int("n", 1000, "")
	flag.Parse()
	cc, _ := pgx.ParseConfig(*dsn)
	var intr sqlmw.Interceptor = sqlmw.NullInterceptor{}
	if *mode == "globalspan" {
		intr = spanIntr{tr: otel.GetTracerProvider().Tracer("x")}
	}
	var db *sql.DB
	if *mode == "pgx" {
		db = sql.OpenDB(stdlib.GetConnector(*cc))
	} else {
		d := sqlmw.Driver(parentDriver{stdlib.GetConnector(*cc)}, intr).(driver.DriverContext)
		c, _ := d.OpenConnector(*dsn)
		db = sql.OpenDB(c)
	}
	db.SetMaxOpenConns(1)
	ctx := tagging.With(context.Background(), "app", "instr")
	for i := 0; i < 500+*n; i++ {
		var got int
		if err := db.QueryRowContext(ctx, "select $1::int + 1", i).Scan(&got); err != nil || got != i+1 {
			fmt.Println(err)
			os.Exit(1)
		}
	}
}
