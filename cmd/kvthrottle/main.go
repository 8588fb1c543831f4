// Command kvthrottle is the multi-tenant throttling proxy for memcached.
//
//	kvthrottle serve --config FILE
//	kvthrottle ctl --addr HOST:PORT --user U set-node JSON | set-bucket NAME JSON | stats [GROUP] | top
//	kvthrottle hash-password            (reads the password on standard input)
//	kvthrottle version
//
// It is thin: flags and wiring only; the work is in the packages.
package main

import (
	"fmt"
	"io"
	"os"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

const usage = `usage:
  kvthrottle serve --config FILE       run the proxy
  kvthrottle ctl [--addr HOST:PORT] [--user U] [--password-file F] COMMAND
      set-node JSON | set-bucket NAME JSON | stats [GROUP] | top
                                       administer a running proxy
                                       (password also from $KVTHROTTLE_PASSWORD;
                                       kvthrottle ctl --help lists every flag)
  kvthrottle hash-password             read a password on stdin, print the [[user]]'s
                                       scram_sha256 and scram_sha512 lines, then
                                       its password_hash value
  kvthrottle version                   print the version
`

// run executes one sub-command and returns the process exit code.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "serve":
		return cmdServe(args[1:], stderr)
	case "ctl":
		return cmdCtl(args[1:], stdin, stdout, stderr)
	case "hash-password":
		return cmdHashPassword(args[1:], stdin, stdout, stderr)
	case "version", "--version", "-v":
		fmt.Fprintf(stdout, "kvthrottle %s\n", version)
		return 0
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "kvthrottle: unknown command %q\n%s", args[0], usage)
		return 2
	}
}
