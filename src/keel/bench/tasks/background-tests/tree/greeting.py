print("Helo, wrold!")
