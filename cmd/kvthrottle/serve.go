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
		if errors.Is(err, flag.ErrHelp) {
			return 0 // the usage is printed; asking for it is no error
		}
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
// SIGHUP reloads the configuration file.
func serve(cfg *bucketcfg.Config, log zerolog.Logger) error {
	st, err := bucketcfg.LoadState(cfg.Throttle.StateFile)
	if err != nil {
		return err
	}
	srv, err := proxy.New(proxy.Options{Config: cfg, State: st, Logger: log, Version: version})
	if err != nil {
		return err
	}
	eff, err := srv.EffectiveConfig()
	if err != nil {
		return err
	}
	logEffective(log, eff)

	if cfg.Metrics.Listen != "" {
		addr, err := srv.Metrics().Serve(cfg.Metrics.Listen, srv.Ready)
		if err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
		log.Info().Str("listen", addr).Msg("metrics: serving /metrics, /healthz and /readyz")
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = srv.Metrics().Shutdown(ctx)
		}()
	}

	done := make(chan error, 1)
	go func() { done <- srv.Serve() }()

	// Separate channels: a SIGHUP arriving during a reload must not take
	// the place of a SIGTERM (a full channel drops the signal).
	hup, stop := make(chan os.Signal, 1), make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(hup)
	defer signal.Stop(stop)
	for {
		select {
		case err := <-done:
			return err
		case <-hup:
			reload(srv, cfg.Path(), log)
		case sig := <-stop:
			log.Info().Str("signal", sig.String()).Msg("draining: no new connections, answering what clients already sent")
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
}

// reload re-reads the configuration file; a bad file is logged and the
// running configuration kept.
func reload(srv *proxy.Server, path string, log zerolog.Logger) {
	cfg, err := bucketcfg.Load(path)
	if err != nil {
		log.Error().Err(err).Msg("reload failed: configuration file rejected; keeping the running configuration")
		return
	}
	if err := srv.Reload(cfg); err != nil {
		log.Error().Err(err).Msg("reload failed")
	}
}

// logEffective logs the configuration in force at start, without secrets
// (password hashes are never logged).
func logEffective(log zerolog.Logger, eff *bucketcfg.Config) {
	buckets := zerolog.Arr()
	for _, b := range eff.Buckets {
		buckets.Dict(zerolog.Dict().Str("name", b.Name).Str("reserved", b.Throttle.Reserved.String()).
			Str("hard_limit", b.Throttle.HardLimit.String()).Int("weight", b.Weight).Bool("flush_enabled", b.FlushEnabled))
	}
	users := zerolog.Arr()
	for _, u := range eff.Users {
		privs := make([]string, len(u.Privileges))
		for i, p := range u.Privileges {
			privs[i] = string(p)
		}
		users.Dict(zerolog.Dict().Str("name", u.Name).Strs("buckets", u.Buckets).Strs("privileges", privs))
	}
	log.Info().Str("version", version).Str("config", eff.Path()).
		Str("listen", eff.Proxy.Listen).Str("default_bucket", eff.Proxy.DefaultBucket).
		Int("max_connections", eff.Proxy.MaxConnections).Int("max_frame_bytes", eff.Proxy.MaxFrameBytes).
		Int("max_held_input_bytes", eff.Proxy.MaxHeldInputBytes).
		Dur("auth_timeout", eff.Proxy.AuthTimeout).Dur("idle_timeout", eff.Proxy.IdleTimeout).Int64("max_unsent_bytes", eff.Proxy.MaxUnsentBytes).
		Strs("servers", eff.Upstream.Servers).Dur("upstream_timeout", eff.Upstream.Timeout).Int("max_inflight", eff.Upstream.MaxInflight).
		Str("capacity", eff.Throttle.Capacity.String()).Str("defaults", eff.Throttle.Defaults.String()).
		Int("read_unit_size", eff.Throttle.ReadUnitSize).Int("write_unit_size", eff.Throttle.WriteUnitSize).
		Dur("burst", eff.Throttle.Burst).Dur("max_hold", eff.Throttle.MaxHold).Int("max_item_bytes", eff.Throttle.MaxItemBytes).
		Str("state_file", eff.Throttle.StateFile).Str("free_pool", eff.Throttle.FreePool.String()).
		Str("metrics_listen", eff.Metrics.Listen).Array("buckets", buckets).Array("users", users).
		Msg("kvthrottle starting")
}
