"""The test harness (harness/): what it installs and builds, without running it."""
