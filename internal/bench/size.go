package bench

import (
	"fmt"
	"strconv"
	"strings"
)

// ParseSize reads a size in bytes: a number, optionally with a binary
// suffix (Ki, Mi, Gi, Ti) or a decimal one (k, M, G, T), as Kubernetes
// writes quantities: "64Mi", "1Gi", "500M", "1048576".
func ParseSize(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   int64
	}{{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40},
		{"k", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}}
	num, mult := s, int64(1)
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			num, mult = strings.TrimSuffix(s, u.suffix), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("size %q: want a positive number of bytes, optionally with Ki, Mi, Gi, Ti, k, M, G or T", s)
	}
	return n * mult, nil
}
