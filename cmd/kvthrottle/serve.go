package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
	"github.com/kvthrottle/kvthrottle/proxy"
)

func cmdServe(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "", "path of the TOML configuration file")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *path == "" {
		fmt.Fprintln(stderr, "kvthrottle serve: --config FILE is required")
		return 2
	}
	cfg, err := bucketcfg.Load(*path)
	if err != nil {
		fmt.Fprintf(stderr, "kvthrottle: %v\n", err)
		return 1
	}
	log, err := newLogger(cfg.Log, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "kvthrottle: %v\n", err)
		return 1
	}
	if err := serve(cfg, log); err != nil {
		log.Error().Err(err).Msg("kvthrottle stopped with an error")
		return 1
	}
	return 0
}

func newLogger(lc bucketcfg.LogConfig, w io.Writer) (zerolog.Logger, error) {
	level, err := zerolog.ParseLevel(lc.Level)
	if err != nil {
		return zerolog.Nop(), fmt.Errorf("log.level: %w", err)
	}
	if lc.Format == "console" {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.RFC3339}
	}
	return zerolog.New(w).Level(level).With().Timestamp().Logger(), nil
}

// serve runs the proxy until SIGTERM or SIGINT, then drains and returns.
func serve(cfg *bucketcfg.Config, log zerolog.Logger) error {
	srv, err := proxy.New(proxy.Options{
		Listen:           cfg.Proxy.Listen,
		Servers:          cfg.Upstream.Servers,
		Timeout:          cfg.Upstream.Timeout,
		MaxConnections:   cfg.Proxy.MaxConnections,
		MaxFrameBytes:    cfg.Proxy.MaxFrameBytes,
		MaxBufferedInput: cfg.Proxy.MaxHeldInputBytes + cfg.Proxy.MaxFrameBytes,
		MaxInflight:      cfg.Upstream.MaxInflight,
		DefaultBucket:    cfg.Proxy.DefaultBucket,
		Logger:           log,
	})
	if err != nil {
		return err
	}
	log.Info().Str("version", version).Str("config", cfg.Path()).Str("listen", cfg.Proxy.Listen).
		Strs("servers", cfg.Upstream.Servers).Dur("upstream_timeout", cfg.Upstream.Timeout).
		Int("max_connections", cfg.Proxy.MaxConnections).Int("max_frame_bytes", cfg.Proxy.MaxFrameBytes).
		Str("default_bucket", cfg.Proxy.DefaultBucket).Int("buckets", len(cfg.Buckets)).Int("users", len(cfg.Users)).
		Msg("kvthrottle starting")

	done := make(chan error, 1)
	go func() { done <- srv.Serve() }()

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	select {
	case err := <-done:
		return err
	case sig := <-sigs:
		log.Info().Str("signal", sig.String()).Msg("draining: no new connections, answering commands in flight")
		ctx, cancel := context.WithTimeout(context.Background(), cfg.Upstream.Timeout+5*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			return err
		}
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
		log.Info().Msg("drained; exiting")
		return nil
	}
}
