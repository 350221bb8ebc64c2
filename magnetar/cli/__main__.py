from magnetar.cli.app import main

main(prog_name="magnetar")
