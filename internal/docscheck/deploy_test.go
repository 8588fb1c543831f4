package docscheck

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
	"github.com/kvthrottle/kvthrottle/fleet"
	"github.com/kvthrottle/kvthrottle/internal/testmc"
)

// sentinelRecipe is the directory of deploy/README.md's section
// "fleet/sentinel/: a fleet on Redis Sentinel".
const sentinelRecipe = "deploy/fleet/sentinel"

// confValue returns the value of directive name in a Redis configuration
// file ("" if absent): the rest of its first line starting with name.
func confValue(conf, name string) string {
	for _, line := range strings.Split(conf, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), name+" "); ok {
			return strings.TrimSpace(rest)
		}
	}
	return ""
}

// TestSentinelRecipe: the files of the Sentinel recipe agree with each
// other (the replica replicates the primary; every sentinel monitors it
// under one name with quorum 2; every kvthrottle configuration loads, and
// its redis_url names the three sentinels and that name, one fleet, an
// instance name and listen addresses of its own), and the Redis side runs:
// started from copies of the files on free ports, the replica
// synchronises, the sentinels find it and each other, and a fleet store
// opened with a configuration's redis_url (its ports moved likewise) is
// seeded and read through them.
func TestSentinelRecipe(t *testing.T) {
	read := func(name string) string { return readRepo(t, filepath.Join(sentinelRecipe, name)) }
	primary, replica := read("redis-primary.conf"), read("redis-replica.conf")
	pport := confValue(primary, "port")
	if got := confValue(replica, "replicaof"); got != "127.0.0.1 "+pport {
		t.Errorf("redis-replica.conf: replicaof %q, want the primary 127.0.0.1 %s", got, pport)
	}
	var sentinelAddrs []string
	for i := 1; i <= 3; i++ {
		conf := read("sentinel-" + strconv.Itoa(i) + ".conf")
		sentinelAddrs = append(sentinelAddrs, "127.0.0.1:"+confValue(conf, "port"))
		if got := confValue(conf, "sentinel monitor"); got != "fleet-store 127.0.0.1 "+pport+" 2" {
			t.Errorf("sentinel-%d.conf: sentinel monitor %q, want fleet-store at the primary with quorum 2", i, got)
		}
	}
	var urls, instances, listens []string
	for i := 1; i <= 2; i++ {
		path := filepath.Join(repoRoot, sentinelRecipe, "fleet-sentinel-"+strconv.Itoa(i)+".toml")
		cfg, err := bucketcfg.Load(path)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		u, err := url.Parse(cfg.Fleet.RedisURL)
		if err != nil {
			t.Fatalf("%s: redis_url: %v", path, err)
		}
		if got := append([]string{u.Host}, u.Query()["addr"]...); !slices.Equal(got, sentinelAddrs) || u.Query().Get("master_name") != "fleet-store" {
			t.Errorf("%s: redis_url %s, want the sentinels %v and master_name fleet-store", path, cfg.Fleet.RedisURL, sentinelAddrs)
		}
		if cfg.Fleet.Name != "sentinel-demo" {
			t.Errorf("%s: fleet name %q, want sentinel-demo (one fleet)", path, cfg.Fleet.Name)
		}
		urls = append(urls, cfg.Fleet.RedisURL)
		instances = append(instances, cfg.Fleet.Instance)
		listens = append(listens, cfg.Proxy.Listen, cfg.Metrics.Listen)
	}
	distinct := func(xs []string) int { return len(slices.Compact(slices.Sorted(slices.Values(xs)))) }
	if distinct(instances) != 2 || distinct(listens) != 4 {
		t.Errorf("the instances' names %v or listen addresses %v are not each their own", instances, listens)
	}
	runSentinelRecipe(t, urls[0], map[string]string{
		"primary": primary, "replica": replica,
		"sentinel-1": read("sentinel-1.conf"), "sentinel-2": read("sentinel-2.conf"), "sentinel-3": read("sentinel-3.conf"),
	})
}

// runSentinelRecipe starts the recipe's Redis side from copies of confs
// whose ports are moved to free ones, and seeds and reads a fleet store
// through the sentinels at redisURL (its ports moved likewise).
func runSentinelRecipe(t *testing.T, redisURL string, confs map[string]string) {
	ports := map[string]string{}
	portRE := regexp.MustCompile(`\b(6395|6396|26395|26396|26397)\b`)
	move := func(s string) string {
		return portRE.ReplaceAllStringFunc(s, func(p string) string {
			if ports[p] == "" {
				ports[p] = strconv.Itoa(testmc.FreePort(t))
			}
			return ports[p]
		})
	}
	dir := t.TempDir()
	start := func(name string, args ...string) *testmc.Redis {
		conf := move(confs[name])
		path := filepath.Join(dir, name+".conf")
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		return testmc.StartRedisConf(t, path, "127.0.0.1:"+confValue(conf, "port"), args...)
	}
	s := &testmc.RedisSentinel{Master: "fleet-store", Data: []*testmc.Redis{start("primary"), start("replica")}}
	for i := 1; i <= 3; i++ {
		s.Sentinels = append(s.Sentinels, start("sentinel-"+strconv.Itoa(i), "--sentinel"))
	}
	if err := s.WaitSettled(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	st, err := fleet.OpenStore(move(redisURL), "sentinel-demo")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, seeded, err := st.Seed(ctx, []byte(`{"version":1}`)); err != nil || !seeded {
		t.Fatalf("seeding the store through the sentinels: seeded %v, %v", seeded, err)
	}
	if doc, _, ok, err := st.Load(ctx); err != nil || !ok || string(doc) != `{"version":1}` {
		t.Fatalf("reading the store through the sentinels: %q %v %v", doc, ok, err)
	}
	testmc.Eventually(t, 10*time.Second, "the replica holds the seeded document", func() bool {
		out, err := testmc.Cli(s.Data[1].Addr, "hget", "{kvthrottle:sentinel-demo}:config", "state")
		return err == nil && out == `{"version":1}`
	})
}
