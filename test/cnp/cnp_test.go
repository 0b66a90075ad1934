package cnp

import (
	"flag"
	"os"
	"testing"
)

var (
	kubeconfig = flag.String("cnp.kubeconfig", "", "the cluster's admin kubeconfig (TestClusterNetworkPolicy, -tags cnpsuite)")
	skipsPath  = flag.String("cnp.skips", "../conformance/cnp-skips.txt", "the tests and subtests not run here, each with its reason")
	profileOut = flag.String("cnp.profile-report", "", "write upstream's ConformanceReport (YAML) here")
	version    = flag.String("cnp.version", "unknown", "podnet's version, for upstream's ConformanceReport")
)

// topTest is the test that runs the suite; the skips' patterns are under it.
const topTest = "TestClusterNetworkPolicy"

// TestMain leaves out the skips of cnp-skips.txt (-test.skip), unless
// -test.skip is given.
func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.skip"); f != nil && f.Value.String() == "" {
		skips, err := ReadSkips(*skipsPath)
		if err != nil {
			println(err.Error())
			os.Exit(2)
		}
		if err := flag.Set("test.skip", SkipPattern(topTest, skips)); err != nil {
			println(err.Error())
			os.Exit(2)
		}
	}
	os.Exit(m.Run())
}
