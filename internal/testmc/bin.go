package testmc

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// KvthrottleBin returns the path of a kvthrottle binary built from this
// tree, for tests that run it as a process. make test builds it once for
// every test process and names it in $KVTHROTTLE_TEST_BIN (before, three
// test processes each compiled every package for it, at the same time);
// without that variable it is one go build of cmdDir (the cmd/kvthrottle
// directory, from the test's package) into outDir.
func KvthrottleBin(t testing.TB, cmdDir, outDir string) string {
	t.Helper()
	if p := os.Getenv("KVTHROTTLE_TEST_BIN"); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("KVTHROTTLE_TEST_BIN: %v", err)
		}
		return p
	}
	bin := filepath.Join(outDir, "kvthrottle")
	out, err := exec.Command("go", "build", "-o", bin, cmdDir).CombinedOutput()
	if err != nil {
		t.Fatalf("go build %s: %v\n%s", cmdDir, err, out)
	}
	return bin
}
