module github.com/fleetlimit/fleetlimit/loadtest

go 1.26.8

require github.com/fleetlimit/fleetlimit/app v0.0.0-00010101000000-000000000000

replace github.com/fleetlimit/fleetlimit/app => ../app
