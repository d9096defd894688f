// The lab's stateful workload: appends one record per interval to a file on its volume and
// syncs it before it counts as written. A record is one line,
//
//	<instance> <sequence> <unix nanoseconds>
//
// where the instance is the pod's UID (a new pod is a new instance) and the sequence goes on
// from the last record in the file, so the lab's data witness can tell who wrote what, and in
// which order, from the file alone. Built by scripts/build-node.sh.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

func main() {
	dir := getenv("RECORDS_DIR", "/data")
	instance := getenv("INSTANCE", "")
	interval, err := time.ParseDuration(getenv("INTERVAL", "200ms"))
	if instance == "" || err != nil {
		fmt.Fprintln(os.Stderr, "writer: set INSTANCE (the pod's UID) and a valid INTERVAL")
		os.Exit(2)
	}
	path := filepath.Join(dir, "records")
	sequence, whole := lastSequence(path)
	// A torn last line (the power went mid-write) was never synced: it goes, as a database
	// drops a torn tail of its log.
	if err := os.Truncate(path, whole); err != nil && !os.IsNotExist(err) {
		fmt.Fprintln(os.Stderr, "writer:", err)
		os.Exit(1)
	}
	file, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, "writer:", err)
		os.Exit(1)
	}
	for {
		sequence++
		record := fmt.Sprintf("%s %d %d\n", instance, sequence, time.Now().UnixNano())
		if _, err := file.WriteString(record); err != nil {
			fmt.Fprintln(os.Stderr, "writer:", err)
			os.Exit(1)
		}
		if err := file.Sync(); err != nil {
			fmt.Fprintln(os.Stderr, "writer:", err)
			os.Exit(1)
		}
		fmt.Print(record)
		time.Sleep(interval)
	}
}

func getenv(key, fallback string) string {
	if value, ok := os.LookupEnv(key); ok {
		return value
	}
	return fallback
}

// The sequence of the file's last whole record (0 for a new file), and the length of its whole
// lines.
func lastSequence(path string) (int64, int64) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, 0
	}
	text := string(data)
	whole := text[:strings.LastIndex(text, "\n")+1]
	var last int64
	for _, line := range strings.Split(whole, "\n") {
		fields := strings.Fields(line)
		if len(fields) != 3 {
			continue
		}
		if n, err := strconv.ParseInt(fields[1], 10, 64); err == nil {
			last = n
		}
	}
	return last, int64(len(whole))
}
