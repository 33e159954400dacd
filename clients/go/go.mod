module fencelock.dev/clients/go

go 1.21
