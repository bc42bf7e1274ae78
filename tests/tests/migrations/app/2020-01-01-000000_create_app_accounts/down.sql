DROP TABLE app_accounts;
