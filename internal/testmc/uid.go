package testmc

import "os"

func currentUID() int { return os.Getuid() }
