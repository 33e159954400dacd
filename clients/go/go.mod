module fencelock/clients/go

go 1.21
