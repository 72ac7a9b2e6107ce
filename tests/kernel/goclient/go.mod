module bulkshim/kclient

go 1.19
