"""The methods' wire protocol, beside the methods: what a method's client and its server must
agree on (the run-config key declarations, which model entries travel as what). Imports only tasks;
clients and strategies import it."""
