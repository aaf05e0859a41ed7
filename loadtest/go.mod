module github.com/fleetlimit/fleetlimit/loadtest

go 1.26.8
